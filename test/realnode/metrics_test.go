package realnode

import (
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/fencer-io/fencer/test/support/devcluster"
	"github.com/fencer-io/fencer/test/support/testenv"
)

// scrapeChartMetrics scrapes each manager replica the chart installed, over
// HTTPS on its pod IP, as Prometheus would: with the token of a
// ServiceAccount bound to the chart's metrics-reader ClusterRole it gets the
// metrics, and exactly one replica says it leads; with an unbound
// ServiceAccount's token it gets 403. The manager checks both through the
// chart's own RBAC (TokenReview, SubjectAccessReview).
func scrapeChartMetrics(t *testing.T, c *devcluster.Cluster) {
	k := kubectlFor(t, c)
	k("create", "serviceaccount", "scraper", "-n", releaseNS)
	k("create", "serviceaccount", "nobody", "-n", releaseNS)
	k("create", "clusterrolebinding", "realnode-scraper", "--clusterrole="+release+"-metrics-reader", "--serviceaccount="+releaseNS+":scraper")
	defer k("delete", "clusterrolebinding", "realnode-scraper")
	allowed := strings.TrimSpace(k("create", "token", "scraper", "-n", releaseNS))
	denied := strings.TrimSpace(k("create", "token", "nobody", "-n", releaseNS))
	ips := strings.Fields(k("get", "pods", "-n", releaseNS, "-l", "app.kubernetes.io/component=manager", "-o", "jsonpath={.items[*].status.podIP}"))
	if len(ips) != 2 {
		t.Fatalf("want 2 manager pods with IPs, got %q", ips)
	}
	leaders := 0.0
	leader := regexp.MustCompile(`(?m)^fencer_manager_leader ([0-9.]+)$`)
	for _, ip := range ips {
		url := fmt.Sprintf("https://%s:8443/metrics", ip)
		if code, _ := testenv.MustScrape(t, url, denied); code != http.StatusForbidden {
			t.Errorf("%s: a ServiceAccount without the metrics-reader role got HTTP %d, want 403", url, code)
		}
		code, body := testenv.MustScrape(t, url, allowed)
		if code != http.StatusOK {
			t.Fatalf("%s: the metrics reader got HTTP %d:\n%.300s", url, code, body)
		}
		m := leader.FindStringSubmatch(body)
		if m == nil {
			t.Fatalf("%s serves no fencer_manager_leader", url)
		}
		v, _ := strconv.ParseFloat(m[1], 64)
		leaders += v
	}
	if leaders != 1 {
		t.Errorf("%v replicas report fencer_manager_leader 1, want exactly 1", leaders)
	}
}
