package chart

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/fencer-io/fencer/test/support/testenv"
)

// monitoring renders everything the chart ships for Prometheus and Grafana.
var monitoring = []string{
	"--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.podMonitor.enabled=true",
	"--set", "metrics.prometheusRule.enabled=true", "--set", "metrics.prometheusRule.alertLabels.team=platform",
	"--set", "metrics.dashboard.enabled=true", "--api-versions", "monitoring.coreos.com/v1",
}

// strict decodes a rendered object into the Prometheus Operator's Go type,
// refusing unknown fields: a misspelt or misplaced field would otherwise be
// dropped by the operator without a word.
func strict(t *testing.T, o *unstructured.Unstructured, into any) {
	t.Helper()
	raw, err := json.Marshal(o.Object)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(into); err != nil {
		t.Fatalf("%s %s is not a valid %T: %v", o.GetKind(), o.GetName(), into, err)
	}
}

// TestMonitorsScrapeWithTheScraperToken: with metrics.secure, both monitors
// scrape over HTTPS with the token of a ServiceAccount the chart binds to
// the metrics-reader ClusterRole, and that role grants exactly GET /metrics.
func TestMonitorsScrapeWithTheScraperToken(t *testing.T) {
	objs := render(t, monitoring...)
	var sm monitoringv1.ServiceMonitor
	var pm monitoringv1.PodMonitor
	strict(t, find(objs, "ServiceMonitor")[0], &sm)
	strict(t, find(objs, "PodMonitor")[0], &pm)
	secret := map[string]*corev1.Secret{}
	for _, o := range find(objs, "Secret") {
		var s corev1.Secret
		strict(t, o, &s)
		secret[s.Name] = &s
	}
	endpoints := map[string]struct {
		scheme string
		auth   *monitoringv1.SafeAuthorization
		tls    bool
	}{
		"ServiceMonitor": {ptrStr(sm.Spec.Endpoints[0].Scheme), sm.Spec.Endpoints[0].Authorization, sm.Spec.Endpoints[0].TLSConfig != nil},
		"PodMonitor":     {ptrStr(pm.Spec.PodMetricsEndpoints[0].Scheme), pm.Spec.PodMetricsEndpoints[0].Authorization, pm.Spec.PodMetricsEndpoints[0].TLSConfig != nil},
	}
	for kind, e := range endpoints {
		if !strings.EqualFold(e.scheme, "https") || e.auth == nil || e.auth.Credentials == nil || !e.tls {
			t.Fatalf("%s does not scrape over HTTPS with a bearer token: scheme %q, authorization %+v", kind, e.scheme, e.auth)
		}
		s := secret[e.auth.Credentials.Name]
		if s == nil || s.Type != corev1.SecretTypeServiceAccountToken || e.auth.Credentials.Key != corev1.ServiceAccountTokenKey {
			t.Fatalf("%s's token %s/%s is not a rendered service-account token Secret", kind, e.auth.Credentials.Name, e.auth.Credentials.Key)
		}
		if sa := s.Annotations[corev1.ServiceAccountNameKey]; sa != "fencer-metrics-scraper" {
			t.Fatalf("%s scrapes as ServiceAccount %q", kind, sa)
		}
	}
	var role rbacv1.ClusterRole
	for _, o := range find(objs, "ClusterRole") {
		if o.GetName() == "fencer-metrics-reader" {
			strict(t, o, &role)
		}
	}
	if len(role.Rules) != 1 || strings.Join(role.Rules[0].NonResourceURLs, ",") != "/metrics" || strings.Join(role.Rules[0].Verbs, ",") != "get" || len(role.Rules[0].Resources) != 0 {
		t.Fatalf("fencer-metrics-reader should grant GET /metrics and nothing else: %+v", role.Rules)
	}
	bound := false
	for _, o := range find(objs, "ClusterRoleBinding") {
		var b rbacv1.ClusterRoleBinding
		strict(t, o, &b)
		if b.RoleRef.Name == "fencer-metrics-reader" && len(b.Subjects) == 1 && b.Subjects[0].Name == "fencer-metrics-scraper" && b.Subjects[0].Namespace == "fencer-system" {
			bound = true
		}
	}
	if !bound {
		t.Fatal("no ClusterRoleBinding gives fencer-metrics-scraper the metrics-reader role")
	}

	insecure := render(t, append([]string{"--set", "metrics.secure=false"}, monitoring...)...)
	var plainSM monitoringv1.ServiceMonitor
	strict(t, find(insecure, "ServiceMonitor")[0], &plainSM)
	if plainSM.Spec.Endpoints[0].Scheme != nil || plainSM.Spec.Endpoints[0].Authorization != nil {
		t.Error("with metrics.secure=false the ServiceMonitor still scrapes over HTTPS with a token")
	}
	for _, o := range find(insecure, "Secret") {
		if o.GetName() == "fencer-metrics-scraper" {
			t.Error("with metrics.secure=false the chart still creates a scraper token")
		}
	}
	var dep struct {
		Spec struct {
			Template corev1.PodTemplateSpec `json:"template"`
		} `json:"spec"`
	}
	one(t, insecure, "Deployment", &dep)
	if args := strings.Join(dep.Spec.Template.Spec.Containers[0].Args, " "); !strings.Contains(args, "--metrics-secure=false") {
		t.Errorf("metrics.secure=false does not reach the manager: %s", args)
	}
}

func ptrStr[T ~string](p *T) string {
	if p == nil {
		return ""
	}
	return string(*p)
}

// TestPrometheusRules runs `promtool check rules` and `promtool test rules`
// (promtool built from the Prometheus module by hack/build-tools.sh) on the
// chart's PrometheusRule at its default thresholds: every alert fires on
// the series it is for, stays quiet on the near misses, and never fires for
// another install's namespace. testdata/rules_test.yaml holds the cases.
func TestPrometheusRules(t *testing.T) {
	objs := render(t, monitoring...)
	var rule monitoringv1.PrometheusRule
	strict(t, find(objs, "PrometheusRule")[0], &rule)
	alerts := 0
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			alerts++
			if r.Labels["team"] != "platform" || r.Labels["severity"] == "" || r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("alert %s lacks metrics.prometheusRule.alertLabels, a severity, a summary or a description: %v %v", r.Alert, r.Labels, r.Annotations)
			}
		}
	}
	if alerts < 10 {
		t.Fatalf("only %d alerts rendered", alerts)
	}
	dir := t.TempDir()
	spec, err := yaml.Marshal(rule.Spec)
	if err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile(filepath.Join("testdata", "rules_test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	// Unit tests expect the default labels: without alertLabels.
	plain := render(t, "--set", "metrics.prometheusRule.enabled=true", "--api-versions", "monitoring.coreos.com/v1")
	var defaults monitoringv1.PrometheusRule
	strict(t, find(plain, "PrometheusRule")[0], &defaults)
	plainSpec, err := yaml.Marshal(defaults.Spec)
	if err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string][]byte{"rules.yaml": plainSpec, "labeled.yaml": spec, "rules_test.yaml": tests} {
		if err := os.WriteFile(filepath.Join(dir, name), body, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, args := range [][]string{{"check", "rules", "rules.yaml", "labeled.yaml"}, {"test", "rules", "rules_test.yaml"}} {
		cmd := exec.Command(filepath.Join(bin, "promtool"), args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// TestDashboard: the dashboard ConfigMap carries the sidecar's label, and
// every panel has a query that parses as PromQL. That each query's metrics
// are ones the manager exports is checked against a live manager by the
// smoke test (test/smoke).
func TestDashboard(t *testing.T) {
	objs := render(t, monitoring...)
	var cm corev1.ConfigMap
	for _, o := range find(objs, "ConfigMap") {
		if o.GetName() == "fencer-dashboard" {
			strict(t, o, &cm)
		}
	}
	if cm.Labels["grafana_dashboard"] != "1" || cm.Namespace != "fencer-system" {
		t.Fatalf("dashboard ConfigMap %s/%s labels %v: want grafana_dashboard=1 in the release namespace", cm.Namespace, cm.Name, cm.Labels)
	}
	_, names, err := testenv.ShippedMetricNames(tool(t, "helm", append([]string{"template", "fencer", chartDir(), "--namespace", "fencer-system"}, monitoring...)...), filepath.Join(bin, "promql-names"))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		// The API server's webhook metrics say what no manager can see: calls
		// that never reached it. The smoke test checks both sources live.
		if !strings.HasPrefix(n, "fencer_") && !strings.HasPrefix(n, "apiserver_admission_webhook_") {
			t.Errorf("a shipped query reads %s, which neither the fencer manager nor the API server exports", n)
		}
	}
	elsewhere := render(t, "--set", "metrics.dashboard.enabled=true", "--set", "metrics.dashboard.namespace=monitoring")
	for _, o := range find(elsewhere, "ConfigMap") {
		if o.GetName() == "fencer-dashboard" && o.GetNamespace() != "monitoring" {
			t.Errorf("metrics.dashboard.namespace=monitoring put the dashboard in %q", o.GetNamespace())
		}
	}
}
