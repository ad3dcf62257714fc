package v1alpha1_test

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/google/cel-go/cel"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/apiserver/pkg/cel/environment"
	"sigs.k8s.io/yaml"
)

// Every CEL rule of the CRDs compiles in the CEL environment of the
// oldest Kubernetes the chart installs on (Chart.yaml's kubeVersion): an
// apiserver refuses a CRD whose rule uses a library it does not have (a
// CEL format library, added in 1.31, would refuse the whole install on
// 1.30). The rules' self is declared dynamic: this checks the libraries
// and functions a rule names, not its types, which the test apiserver's
// own checks cover.
func TestCRDRulesCompileOnTheOldestSupportedKubernetes(t *testing.T) {
	chart, err := os.ReadFile("../../charts/fencer/Chart.yaml")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^kubeVersion: ">=(\d+\.\d+)`).FindSubmatch(chart)
	if m == nil {
		t.Fatal("Chart.yaml names no lowest kubeVersion")
	}
	oldest := version.MustParseGeneric(string(m[1]))
	env, err := environment.MustBaseEnvSet(oldest).Env(environment.NewExpressions)
	if err != nil {
		t.Fatal(err)
	}
	if env, err = env.Extend(cel.Variable("self", cel.DynType), cel.Variable("oldSelf", cel.DynType)); err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob("../../config/crd/bases/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no CRDs found: %v", err)
	}
	n := 0
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var crd any
		if err := yaml.Unmarshal(raw, &crd); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, rule := range rules(crd) {
			n++
			if _, iss := env.Compile(rule); iss.Err() != nil {
				t.Errorf("%s: the rule %q does not compile on Kubernetes %s: %v", filepath.Base(f), rule, oldest, iss.Err())
			}
		}
	}
	if n == 0 {
		t.Fatal("no CEL rules found in the CRDs")
	}
}

// rules are the x-kubernetes-validations rules anywhere in v.
func rules(v any) []string {
	var out []string
	switch v := v.(type) {
	case map[string]any:
		if list, ok := v["x-kubernetes-validations"].([]any); ok {
			for _, r := range list {
				if r, ok := r.(map[string]any); ok {
					if s, ok := r["rule"].(string); ok {
						out = append(out, s)
					}
				}
			}
		}
		for _, c := range v {
			out = append(out, rules(c)...)
		}
	case []any:
		for _, c := range v {
			out = append(out, rules(c)...)
		}
	}
	return out
}
