package smoke

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fencer-io/fencer/test/support/testenv"
)

// admin is the user `make dev`'s kubeconfig authenticates as.
const admin = "fencer-dev-admin"

// traceable checks that the refused writes the smoke test just made show
// up where an operator looks: the manager's log and a WriteRefused Event
// on the Lease, each naming the requester, and the refusal metrics; and
// that the Lease-state metrics count the example Lease as held.
func traceable(t *testing.T, state, devOutput string, kubectl func(...string) string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		logs, _ := os.ReadFile(filepath.Join(state, "logs", "fencer.log"))
		refusal := ""
		for _, l := range strings.Split(string(logs), "\n") {
			if strings.Contains(l, "refused a write to a fenced object") && strings.Contains(l, admin) && strings.Contains(l, "default/report") {
				refusal = l
			}
		}
		events := kubectl("get", "events", "--field-selector", "reason=WriteRefused,involvedObject.name=report", "-o", "jsonpath={.items[*].message}")
		if refusal != "" && strings.Contains(events, admin) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a refused write is not traceable: log line %q, WriteRefused Events %q", refusal, events)
		}
		time.Sleep(200 * time.Millisecond)
	}
	code, metrics := testenv.MustScrape(t, metricsURL(t, devOutput), readerToken(kubectl))
	if code != 200 {
		t.Fatalf("scraping the manager's metrics: HTTP %d\n%.300s", code, metrics)
	}
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`fencer_admission_decisions_total\{operation="UPDATE",reason="MissingToken",result="refused"\} [1-9]`),
		regexp.MustCompile(`fencer_leases\{state="held"\} [1-9]`),
		regexp.MustCompile(`fencer_lease_without_holder_max_seconds [0-9]`),
		regexp.MustCompile(`fencer_build_info\{goversion="go[0-9.]+",version="[0-9.]+"\} 1`),
	} {
		if !want.MatchString(metrics) {
			t.Errorf("the manager's metrics have no line matching %s", want)
		}
	}
}
