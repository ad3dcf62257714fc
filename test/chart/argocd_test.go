package chart

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	lua "github.com/yuin/gopher-lua"
	"sigs.k8s.io/yaml"
)

// TestArgoCDHealthChecks runs the Argo CD health checks of
// docs/operations.md, as they appear there, with gopher-lua (the
// interpreter Argo CD embeds), against Leases and IDRanges in each state.
func TestArgoCDHealthChecks(t *testing.T) {
	scripts := argoCDScripts(t)
	cond := func(typ, status, reason string, gen int) map[string]any {
		return map[string]any{"type": typ, "status": status, "reason": reason, "message": reason, "observedGeneration": gen}
	}
	obj := func(gen int, conds ...map[string]any) map[string]any {
		o := map[string]any{"metadata": map[string]any{"generation": gen}}
		if conds != nil {
			list := make([]any, len(conds))
			for i, c := range conds {
				list[i] = c
			}
			o["status"] = map[string]any{"conditions": list}
		}
		return o
	}
	for _, tc := range []struct {
		kind, name string
		obj        map[string]any
		want       string
	}{
		{"Lease", "not reconciled yet", obj(1), "Progressing"},
		{"Lease", "held", obj(2, cond("Held", "True", "Granted", 2), cond("Ready", "True", "Granted", 2)), "Healthy"},
		{"Lease", "held, spec changed since", obj(3, cond("Ready", "True", "Granted", 2)), "Progressing"},
		{"Lease", "suspended", obj(1, cond("Ready", "True", "Suspended", 1)), "Healthy"},
		{"Lease", "no candidates", obj(1, cond("Ready", "False", "NoCandidates", 1)), "Progressing"},
		{"Lease", "etcd unavailable", obj(1, cond("Ready", "Unknown", "EtcdUnavailable", 1)), "Degraded"},
		{"Lease", "etcd revision regressed", obj(1, cond("Ready", "False", "EtcdRevisionRegressed", 1)), "Degraded"},
		{"IDRange", "allocating", obj(1, cond("Ready", "True", "Allocating", 1), cond("Exhausted", "False", "Available", 1)), "Healthy"},
		{"IDRange", "exhausted", obj(1, cond("Ready", "True", "Allocating", 1), cond("Exhausted", "True", "Exhausted", 1)), "Degraded"},
		{"IDRange", "next regressed", obj(1, cond("Ready", "False", "NextRegressed", 1)), "Degraded"},
		{"IDRange", "not reconciled yet", obj(1), "Progressing"},
	} {
		t.Run(tc.kind+" "+tc.name, func(t *testing.T) {
			if got := runHealth(t, scripts["resource.customizations.health.fencer.io_"+tc.kind], tc.obj); got != tc.want {
				t.Fatalf("health %q, want %q", got, tc.want)
			}
		})
	}
}

// argoCDScripts reads the argocd-cm entries from docs/operations.md.
func argoCDScripts(t *testing.T) map[string]string {
	raw, err := os.ReadFile(filepath.Join(root, "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(raw), "```yaml\nresource.customizations.health.fencer.io_Lease")
	block, _, ok2 := strings.Cut(after, "```")
	if !ok || !ok2 {
		t.Fatal("docs/operations.md has no argocd-cm block for fencer.io_Lease")
	}
	scripts := map[string]string{}
	if err := yaml.Unmarshal([]byte("resource.customizations.health.fencer.io_Lease"+block), &scripts); err != nil {
		t.Fatalf("the argocd-cm block is not YAML: %v", err)
	}
	if len(scripts) != 2 {
		t.Fatalf("want the Lease and IDRange checks, got %d", len(scripts))
	}
	return scripts
}

// runHealth runs a health script as Argo CD does: obj is a global table,
// and the script returns a table with a status.
func runHealth(t *testing.T, script string, obj map[string]any) string {
	L := lua.NewState()
	defer L.Close()
	L.SetGlobal("obj", toLua(L, obj))
	if err := L.DoString(script); err != nil {
		t.Fatalf("the script fails: %v", err)
	}
	ret, ok := L.Get(-1).(*lua.LTable)
	if !ok {
		t.Fatalf("the script returned %v, not a table", L.Get(-1))
	}
	return ret.RawGetString("status").String()
}

func toLua(L *lua.LState, v any) lua.LValue {
	switch v := v.(type) {
	case map[string]any:
		tb := L.NewTable()
		for k, x := range v {
			tb.RawSetString(k, toLua(L, x))
		}
		return tb
	case []any:
		tb := L.NewTable()
		for _, x := range v {
			tb.Append(toLua(L, x))
		}
		return tb
	case string:
		return lua.LString(v)
	case int:
		return lua.LNumber(v)
	case bool:
		return lua.LBool(v)
	}
	return lua.LNil
}
