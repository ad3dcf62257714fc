package chart

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestLeaseDeleteWebhookOverlay: config/lease-delete-webhook builds, object
// for object, what the chart renders with leaseDeletion.webhook=true (put
// through config/default's kustomization), so the overlay's hand-written
// patches cannot drift from the chart; and the real apiserver accepts it.
func TestLeaseDeleteWebhookOverlay(t *testing.T) {
	dir := t.TempDir()
	rendered := tool(t, "helm", "template", "fencer", chartDir(), "--namespace", "fencer-system",
		"--set", "helmTest.enabled=false", "--set", "leaseDeletion.webhook=true")
	kust, err := os.ReadFile(filepath.Join(root, "config", "default", "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	ns, err := os.ReadFile(filepath.Join(root, "config", "default", "namespace.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string][]byte{"kustomization.yaml": kust, "namespace.yaml": ns, "fencer.yaml": []byte(rendered)} {
		if err := os.WriteFile(filepath.Join(dir, name), body, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want := objectsByKey(t, tool(t, "kubectl", "kustomize", dir))
	got := objectsByKey(t, tool(t, "kubectl", "kustomize", filepath.Join(root, "config", "lease-delete-webhook")))
	if len(got) != len(want) {
		t.Errorf("the overlay builds %d objects, the chart with leaseDeletion.webhook=true %d", len(got), len(want))
	}
	for key, w := range want {
		g, ok := got[key]
		switch {
		case !ok:
			t.Errorf("the overlay lacks %s", key)
		case g != w:
			t.Errorf("%s differs from the chart's rendering with leaseDeletion.webhook=true:\noverlay:\n%s\nchart:\n%s", key, g, w)
		}
	}
	for _, s := range []string{"--lease-delete-webhook", "name: lease-delete.fencer.io"} {
		if !strings.Contains(got["Deployment/fencer-system/fencer"]+got["ValidatingWebhookConfiguration//fencer-fencing"], s) {
			t.Errorf("the overlay lacks %q", s)
		}
	}
	if strings.Contains(got["MutatingWebhookConfiguration//fencer-fencing"], "lease-finalizer.fencer.io") {
		t.Error("the overlay keeps lease-finalizer.fencer.io")
	}
	if _, err := toolErr("kubectl", "get", "namespace", "fencer-system"); err != nil {
		tool(t, "kubectl", "create", "namespace", "fencer-system")
	}
	tool(t, "kubectl", "apply", "--dry-run=server", "-k", filepath.Join(root, "config", "lease-delete-webhook"))
}

// objectsByKey splits a multi-document YAML stream into its objects, each
// re-marshalled (so that key order and formatting do not count), by
// kind/namespace/name.
func objectsByKey(t *testing.T, stream string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, doc := range strings.Split(stream, "\n---") {
		var o struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name      string `json:"name"`
				Namespace string `json:"namespace"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
			t.Fatalf("YAML: %v\n%s", err, doc)
		}
		if o.Kind == "" {
			continue
		}
		var m map[string]any
		if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
			t.Fatal(err)
		}
		norm, err := yaml.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		out[o.Kind+"/"+o.Metadata.Namespace+"/"+o.Metadata.Name] = string(norm)
	}
	return out
}
