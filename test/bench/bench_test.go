// Package bench holds the measurements of issue #9 that need a real
// control plane: failover against its anchors, admission, and scale. They
// are tests, run only by `make bench` (never by `make test`), that print
// tables and append Go benchmark-format lines to $FENCER_BENCH_OUT for
// benchstat. No assertion here is about time: a measurement reports, it
// does not pass or fail on a machine's speed.
package bench

import (
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"

	"github.com/fencer-io/fencer/test/support/framework"
)

var fx *framework.Fencer

func TestMain(m *testing.M) {
	// client-go's leaderelection logs every step through klog.
	klog.SetLogger(logr.Discard())
	var err error
	if fx, err = framework.StartFencer(true); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	fx.Stop()
	os.Exit(code)
}

// quantile of sorted durations, nearest rank.
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func sorted(ds []time.Duration) []time.Duration {
	out := append([]time.Duration(nil), ds...)
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

var outMu sync.Mutex

// record appends a benchmark-format line (name, one iteration, then
// value/unit pairs) to $FENCER_BENCH_OUT, for benchstat.
func record(t *testing.T, name string, metrics ...any) {
	t.Helper()
	path := os.Getenv("FENCER_BENCH_OUT")
	if path == "" {
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Benchmark%s 1", name)
	for i := 0; i+1 < len(metrics); i += 2 {
		fmt.Fprintf(&b, " %v %s", metrics[i], metrics[i+1])
	}
	outMu.Lock()
	defer outMu.Unlock()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := fmt.Fprintln(f, b.String()); err != nil {
		t.Fatal(err)
	}
}

func ms(d time.Duration) string { return fmt.Sprintf("%.0f", float64(d.Microseconds())/1000) }
