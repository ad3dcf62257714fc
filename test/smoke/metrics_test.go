package smoke

import (
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/fencer-io/fencer/test/support/devcluster"
	"github.com/fencer-io/fencer/test/support/testenv"
)

// metricsURL is the manager's metrics endpoint that `make dev` printed.
func metricsURL(t *testing.T, devOutput string) string {
	t.Helper()
	url := regexp.MustCompile(`Metrics: (\S+)`).FindStringSubmatch(devOutput)
	if url == nil {
		t.Fatalf("make dev printed no metrics URL:\n%s", devOutput)
	}
	return url[1]
}

// readerToken is a token of the dev cluster's metrics-reader ServiceAccount.
func readerToken(kubectl func(...string) string) string {
	return strings.TrimSpace(kubectl("create", "token", devcluster.MetricsReader, "-n", devcluster.ManagerNamespace))
}

// checkMetrics: the metrics endpoint serves HTTPS to a token allowed to get
// /metrics and to nobody else; and every query of the chart's alerts and
// dashboard reads metrics this manager really exports.
func checkMetrics(t *testing.T, root, bin, devOutput string, kubectl func(...string) string) {
	url := metricsURL(t, devOutput)
	if !strings.HasPrefix(url, "https://") {
		t.Fatalf("make dev serves metrics at %s, not over HTTPS", url)
	}
	if code, body := testenv.MustScrape(t, url, ""); code != http.StatusUnauthorized {
		t.Errorf("a scrape without a token got HTTP %d, want 401:\n%.300s", code, body)
	}
	// A token the TokenReview rejects with an error gets controller-runtime's
	// 500 "Authentication failed", not 401; either way no metrics.
	if code, body := testenv.MustScrape(t, url, "not-a-token"); (code != http.StatusUnauthorized && code != http.StatusInternalServerError) || strings.Contains(body, "fencer_") {
		t.Errorf("a scrape with a forged token got HTTP %d, want 401 or 500 and no metrics:\n%.300s", code, body)
	}
	if code, _ := testenv.MustScrape(t, url, strings.TrimSpace(kubectl("create", "token", "default", "-n", "default"))); code != http.StatusForbidden {
		t.Errorf("a scrape by a ServiceAccount without the metrics-reader role got HTTP %d, want 403", code)
	}
	code, body := testenv.MustScrape(t, url, readerToken(kubectl))
	if code != http.StatusOK {
		t.Fatalf("the metrics reader's scrape got HTTP %d:\n%.300s", code, body)
	}
	exported, err := exportedNames(body)
	if err != nil {
		t.Fatal(err)
	}
	// FencerWebhookUnreachable and a dashboard panel read the API server's
	// webhook metrics: what no manager sees.
	apiserver, err := exportedNames(kubectl("get", "--raw", "/metrics"))
	if err != nil {
		t.Fatal(err)
	}
	for n := range apiserver {
		if strings.HasPrefix(n, "apiserver_admission_webhook_") {
			exported[n] = true
		}
	}

	args := []string{"template", "fencer", filepath.Join(root, "charts", "fencer"), "-n", "fencer-system", "--api-versions", "monitoring.coreos.com/v1",
		"--set", "metrics.prometheusRule.enabled=true", "--set", "metrics.dashboard.enabled=true"}
	rendered, err := exec.Command(filepath.Join(bin, "helm"), args...).Output()
	if err != nil {
		t.Fatalf("helm %s: %v", strings.Join(args, " "), err)
	}
	exprs, names, err := testenv.ShippedMetricNames(string(rendered), filepath.Join(bin, "promql-names"))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if !exported[n] {
			t.Errorf("the chart's alerts or dashboard read %s, which neither the manager nor the API server exports", n)
		}
	}
	t.Logf("%d shipped queries read %d metrics, each exported", exprs, len(names))
}

// exportedNames are the series names a Prometheus scraping body stores: a
// histogram's _bucket, _sum and _count, a summary's quantiles, _sum and
// _count.
func exportedNames(body string) (map[string]bool, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("the manager's metrics do not parse: %w", err)
	}
	names := map[string]bool{}
	for name, f := range families {
		switch f.GetType() {
		case dto.MetricType_HISTOGRAM:
			names[name+"_bucket"], names[name+"_sum"], names[name+"_count"] = true, true, true
		case dto.MetricType_SUMMARY:
			names[name], names[name+"_sum"], names[name+"_count"] = true, true, true
		default:
			names[name] = true
		}
	}
	return names, nil
}
