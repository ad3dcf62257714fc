package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/test/support/testenv"
)

// The CRDs admit a selector whose label value the API does not allow; the
// controller reads it as matching no pod and says so in the status. The
// plugin must read it the same way: status lists every Lease of the
// namespace, the bad one with no candidates (it failed whole, listing
// none), and ids shows the pods that carry the IDRange's annotation, with
// a warning (it failed). A namespace with no Lease says so, as kubectl get
// does, instead of printing a bare header.
func TestThePluginReadsAnInvalidSelectorAsTheControllerDoes(t *testing.T) {
	kubeconfig, c := apiserver(t)
	ctx := context.Background()
	for _, ns := range []string{"r", "empty"} {
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	for name, app := range map[string]string{"good": "w", "bad": "bad value!"} {
		l := &fencerv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "r"},
			Spec: fencerv1.LeaseSpec{HolderSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": app}}}}
		if err := c.Create(ctx, l); err != nil {
			t.Fatalf("the API refused Lease %s: %v", name, err)
		}
	}
	rng := &fencerv1.IDRange{ObjectMeta: metav1.ObjectMeta{Name: "ids", Namespace: "r"},
		Spec: fencerv1.IDRangeSpec{Mode: fencerv1.ModeBlocks, Min: 1, Max: 1000, BlockSize: ptr.To[int64](10),
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "bad value!"}}}}
	if err := c.Create(ctx, rng); err != nil {
		t.Fatalf("the API refused the IDRange: %v", err)
	}
	for name, ann := range map[string]map[string]string{"w-0": {fencerv1.IDRangeAnnotationPrefix + "ids": "block=1-10"}, "w-1": nil} {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "r", Labels: map[string]string{"app": "w"}, Annotations: ann},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "pause"}}}}
		if err := c.Create(ctx, pod); err != nil {
			t.Fatal(err)
		}
	}

	out := plugin(t, kubeconfig, "-n", "r", "status")
	for _, want := range []string{"good", "bad"} {
		if !strings.Contains(out, "\n"+want+" ") {
			t.Errorf("status does not list Lease %s:\n%s", want, out)
		}
	}
	var listed []leaseStatus
	if err := json.Unmarshal([]byte(plugin(t, kubeconfig, "-n", "r", "status", "-o", "json")), &listed); err != nil || len(listed) != 2 {
		t.Errorf("status -o json: %d Leases (%v), want 2", len(listed), err)
	}
	var bad leaseStatus
	if err := json.Unmarshal([]byte(plugin(t, kubeconfig, "-n", "r", "status", "bad", "-o", "json")), &bad); err != nil || len(bad.Candidates) != 0 {
		t.Errorf("status bad: %+v (%v), want it with no candidates", bad, err)
	}

	ids := plugin(t, kubeconfig, "-n", "r", "ids", "ids")
	if !strings.Contains(ids, "Warning:") || !strings.Contains(ids, "w-0") || strings.Contains(ids, "w-1") {
		t.Errorf("ids of an IDRange with an invalid selector: want a warning and w-0 (its annotation), not w-1:\n%s", ids)
	}

	cmd := root()
	var stdout, stderr bytes.Buffer
	cmd.SetOut(&stdout)
	cmd.SetErr(&stderr)
	cmd.SetArgs([]string{"--kubeconfig", kubeconfig, "-n", "empty", "status"})
	if err := cmd.Execute(); err != nil || stdout.Len() != 0 || !strings.Contains(stderr.String(), "No fencer Leases found in namespace empty") {
		t.Errorf("status in a namespace with no Lease: %v, stdout %q, stderr %q", err, stdout.String(), stderr.String())
	}
}

// check names the Lease a write is fenced by only when the object's
// fencer.io/lease label names one: an empty value fences nothing, and the
// webhook admits the object's writes without a token (check said "Fenced
// by: lease r/").
func TestCheckReadsAnEmptyLeaseLabelAsNoFence(t *testing.T) {
	kubeconfig, c := apiserver(t)
	ctx := context.Background()
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "r"}}); err != nil {
		t.Fatal(err)
	}
	for name, lease := range map[string]string{"unfenced": "", "fenced": "job"} {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "r", Labels: map[string]string{fencerv1.LeaseLabel: lease}}}
		if err := c.Create(ctx, cm); err != nil {
			t.Fatal(err)
		}
		var d decision
		if err := json.Unmarshal([]byte(plugin(t, kubeconfig, "-n", "r", "check", "cm/"+name, "-o", "json")), &d); err != nil {
			t.Fatal(err)
		}
		want := ""
		if lease != "" {
			want = "r/" + lease
		}
		if d.Lease != want {
			t.Errorf("check of a ConfigMap labelled %s=%q: fenced by %q, want %q", fencerv1.LeaseLabel, lease, d.Lease, want)
		}
	}
	// A cluster-scoped object is never fenced, whatever its label: the
	// webhook judges only namespaced objects (a Lease lives in one).
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "labelled", Labels: map[string]string{fencerv1.LeaseLabel: "job"}}}
	if err := c.Create(ctx, role); err != nil {
		t.Fatal(err)
	}
	var d decision
	if err := json.Unmarshal([]byte(plugin(t, kubeconfig, "-n", "r", "check", "clusterrole/labelled", "-o", "json")), &d); err != nil {
		t.Fatal(err)
	}
	if d.Lease != "" || !d.ClusterScoped {
		t.Errorf("check of a ClusterRole labelled %s=job: fenced by %q, cluster-scoped %v; want no Lease, cluster-scoped", fencerv1.LeaseLabel, d.Lease, d.ClusterScoped)
	}
}

// apiserver starts an apiserver with fencer's CRDs and returns an admin's
// kubeconfig file and a client.
func apiserver(t *testing.T) (string, client.Client) {
	t.Helper()
	env, c := testenv.Start(t)
	admin, err := env.ControlPlane.AddUser(envtest.User{Name: "admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := admin.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	return path, c
}

// plugin runs kubectl fencer with args and returns what it printed.
func plugin(t *testing.T, kubeconfig string, args ...string) string {
	t.Helper()
	cmd := root()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetArgs(append([]string{"--kubeconfig", kubeconfig}, args...))
	if err := cmd.Execute(); err != nil {
		t.Fatalf("kubectl fencer %s: %v", strings.Join(args, " "), err)
	}
	return out.String()
}
