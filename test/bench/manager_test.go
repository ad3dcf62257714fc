package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/fencer-io/fencer/test/support/devcluster"
	"github.com/fencer-io/fencer/test/support/testenv"
)

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// managerBinary builds cmd/fencer once per run.
func managerBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		root, err := testenv.RepoRoot()
		if err != nil {
			binErr = err
			return
		}
		dir, err := os.MkdirTemp("", "fencer-bench")
		if err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(dir, "fencer")
		if out, err := exec.Command("go", "build", "-C", root, "-o", binPath, "./cmd/fencer").CombinedOutput(); err != nil {
			binErr = fmt.Errorf("building fencer: %w\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// webhookManager runs the manager binary as its own process, serving the
// webhook where the envtest apiserver's configurations point, with plain
// HTTP metrics on loopback: the load generator (this process) and the
// webhook do not share a profile.
func webhookManager(t *testing.T) *manager {
	t.Helper()
	wh := fx.Env.WebhookInstallOptions
	ports, err := devcluster.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	m := startManager(t, fx, managerBinary(t), "--webhook-host="+wh.LocalServingHost, fmt.Sprintf("--webhook-port=%d", wh.LocalServingPort),
		"--webhook-cert-dir="+wh.LocalServingCertDir, "--metrics-bind-address="+addr, "--metrics-secure=false")
	m.metrics = "http://" + addr + "/metrics"
	t.Cleanup(m.stop)
	return m
}

// sideSample is the manager's own account at one instant: its admission
// and live-token histograms' sums and counts, and its CPU time.
type sideSample struct {
	handlerSum, handlerN, lookupSum, lookupN float64
	cpu                                      time.Duration
}

// sideDelta is what the manager spent between two samples.
type sideDelta struct {
	handler, lookup time.Duration // means
	cpu             time.Duration // total
}

func (m *manager) sample(t *testing.T) sideSample {
	t.Helper()
	body, err := get(m.metrics)
	if err != nil {
		t.Fatal(err)
	}
	families := parseMetrics(t, body)
	var s sideSample
	s.handlerSum, s.handlerN = histogram(families, "fencer_admission_duration_seconds", "operation", "UPDATE")
	s.lookupSum, s.lookupN = histogram(families, "fencer_token_lookup_duration_seconds", "result", "ok")
	s.cpu, _ = m.cpu()
	return s
}

func (s sideSample) since(b sideSample) sideDelta {
	return sideDelta{
		handler: mean(s.handlerSum-b.handlerSum, s.handlerN-b.handlerN),
		lookup:  mean(s.lookupSum-b.lookupSum, s.lookupN-b.lookupN),
		cpu:     s.cpu - b.cpu,
	}
}

func mean(sum, n float64) time.Duration {
	if n == 0 {
		return 0
	}
	return time.Duration(sum / n * float64(time.Second))
}

// parseMetrics parses a Prometheus text exposition.
func parseMetrics(t *testing.T, body string) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	return families
}

// apiserverMetrics are the apiserver's own metrics, from its /metrics.
func apiserverMetrics(t *testing.T, cfg *rest.Config) map[string]*dto.MetricFamily {
	t.Helper()
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := cs.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return parseMetrics(t, string(raw))
}

// histogram is the sum and count of the series of a histogram whose label
// has value.
func histogram(families map[string]*dto.MetricFamily, name, label, value string) (sum, count float64) {
	f := families[name]
	if f == nil || f.GetType() != dto.MetricType_HISTOGRAM {
		return 0, 0
	}
	for _, m := range f.GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == label && l.GetValue() == value {
				sum += m.GetHistogram().GetSampleSum()
				count += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return sum, count
}

// apiserverSample is the apiserver's own time in fencer's mutating
// webhook: apiserver_admission_webhook_admission_duration_seconds for
// record.fencer.io, from its /metrics.
type apiserverSample struct{ sum, n float64 }

func apiserverWebhookTime(t *testing.T) apiserverSample {
	t.Helper()
	sum, n := histogram(apiserverMetrics(t, fx.Config), "apiserver_admission_webhook_admission_duration_seconds", "name", "record.fencer.io")
	return apiserverSample{sum, n}
}

func (s apiserverSample) since(b apiserverSample) time.Duration { return mean(s.sum-b.sum, s.n-b.n) }

// profile saves a CPU profile of the manager over the next seconds to
// $ADMISSION_PROFILE_DIR/<name>-cpu.pprof, when that is set; the channel
// closes when it is done.
func (m *manager) profile(t *testing.T, name string, seconds int) <-chan struct{} {
	done := make(chan struct{})
	dir := os.Getenv("ADMISSION_PROFILE_DIR")
	if dir == "" {
		close(done)
		return done
	}
	go func() {
		defer close(done)
		if err := fetch(fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", m.pprof, seconds), filepath.Join(dir, name+"-cpu.pprof")); err != nil {
			t.Error(err)
		}
	}()
	return done
}
