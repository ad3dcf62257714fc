package testenv

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// grafanaVars are the dashboard's variables and Grafana's built-ins, with
// values PromQL parses, so a dashboard query can be checked like a rule.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$namespace", "fencer-system")

// labelValues is a Grafana variable query, label_values(METRIC, LABEL).
var labelValues = regexp.MustCompile(`^label_values\((.+),\s*\w+\)$`)

// MonitoringQueries returns every PromQL expression the chart ships, from
// `helm template` output rendered with the PrometheusRule and the dashboard
// on: each alert's expr, each dashboard panel's, and the metric of each
// dashboard variable.
func MonitoringQueries(rendered string) ([]string, error) {
	var exprs []string
	var rules, dashboards int
	for _, doc := range strings.Split(rendered, "\n---") {
		var obj struct {
			Kind string `json:"kind"`
			Spec struct {
				Groups []struct {
					Rules []struct {
						Expr string `json:"expr"`
					} `json:"rules"`
				} `json:"groups"`
			} `json:"spec"`
			Data map[string]string `json:"data"`
		}
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			return nil, fmt.Errorf("rendered YAML: %w", err)
		}
		switch {
		case obj.Kind == "PrometheusRule":
			rules++
			for _, g := range obj.Spec.Groups {
				for _, r := range g.Rules {
					exprs = append(exprs, r.Expr)
				}
			}
		case obj.Kind == "ConfigMap" && obj.Data["fencer.json"] != "":
			dashboards++
			d, err := dashboardQueries([]byte(obj.Data["fencer.json"]))
			if err != nil {
				return nil, err
			}
			exprs = append(exprs, d...)
		}
	}
	if rules != 1 || dashboards != 1 {
		return nil, fmt.Errorf("want one PrometheusRule and one dashboard ConfigMap in the rendering, got %d and %d", rules, dashboards)
	}
	return exprs, nil
}

func dashboardQueries(raw []byte) ([]string, error) {
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Type    string `json:"type"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Type  string `json:"type"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		return nil, fmt.Errorf("the dashboard is not JSON: %w", err)
	}
	var exprs []string
	for _, p := range d.Panels {
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			return nil, fmt.Errorf("dashboard panel %q has no query", p.Title)
		}
		for _, t := range p.Targets {
			exprs = append(exprs, grafanaVars.Replace(t.Expr))
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		q, _ := v.Query.(map[string]any)
		m := labelValues.FindStringSubmatch(fmt.Sprint(q["query"]))
		if m == nil {
			return nil, fmt.Errorf("dashboard variable %s: want label_values(METRIC, LABEL), got %v", v.Name, v.Query)
		}
		exprs = append(exprs, m[1])
	}
	return exprs, nil
}

// MetricNames runs promql-names (built into bin/ by hack/build-tools.sh
// from the Prometheus module) on exprs: the metric names they select, or
// an error naming the expression that does not parse.
func MetricNames(bin string, exprs []string) ([]string, error) {
	var in bytes.Buffer
	for _, e := range exprs {
		line, _ := json.Marshal(e)
		in.Write(append(line, '\n'))
	}
	cmd := exec.Command(bin)
	cmd.Stdin = &in
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s: %w: %s", bin, err, stderr.String())
	}
	return strings.Fields(string(out)), nil
}

// ShippedMetricNames takes `helm template` output with the PrometheusRule
// and the dashboard on, and returns how many PromQL expressions they hold
// and the metric names those read.
func ShippedMetricNames(rendered, promqlNames string) (int, []string, error) {
	exprs, err := MonitoringQueries(rendered)
	if err != nil {
		return 0, nil, err
	}
	names, err := MetricNames(promqlNames, exprs)
	return len(exprs), names, err
}

// Scrape GETs a metrics endpoint with token as the bearer (none if empty).
// The manager's metrics certificate is self-signed unless one is given, as
// in a cluster, so it is not verified.
func Scrape(url, token string) (int, string, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	cl := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // self-signed, as documented
	resp, err := cl.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(raw), err
}

// MustScrape is Scrape for a test, which fails on a transport error.
func MustScrape(t testing.TB, url, token string) (int, string) {
	t.Helper()
	code, body, err := Scrape(url, token)
	if err != nil {
		t.Fatal(err)
	}
	return code, body
}
