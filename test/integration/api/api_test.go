// Package api tests fencer's CRDs against a real kube-apiserver: defaults,
// OpenAPI validation and the CEL rules, with the messages users see.
package api

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/test/support/testenv"
)

var (
	env *envtest.Environment
	cl  client.Client
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	var err error
	env, err = testenv.New()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cfg, err := env.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting envtest:", err)
		return 1
	}
	defer func() { _ = env.Stop() }()
	cl, err = client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

func lease(name string) *fencerv1.Lease {
	return &fencerv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: fencerv1.LeaseSpec{
			HolderSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "x"}},
		},
	}
}

func blocks(name string) *fencerv1.IDRange {
	return &fencerv1.IDRange{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: fencerv1.IDRangeSpec{
			Mode: fencerv1.ModeBlocks, Min: 1, Max: 1000, BlockSize: ptr.To[int64](10),
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "x"}},
		},
	}
}

func slots(name string) *fencerv1.IDRange {
	return &fencerv1.IDRange{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: fencerv1.IDRangeSpec{
			Mode: fencerv1.ModeSlots, Min: 0, Max: 1023, SlotTTLSeconds: ptr.To[int32](15),
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "x"}},
		},
	}
}

// mustBeRefused checks err is the apiserver's Invalid error carrying want.
func mustBeRefused(t *testing.T, err error, want string) {
	t.Helper()
	if err == nil {
		t.Fatalf("the apiserver accepted it; want a refusal with %q", want)
	}
	if !apierrors.IsInvalid(err) {
		t.Fatalf("want an Invalid error with %q, got %v", want, err)
	}
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("refusal does not say %q:\n%v", want, err)
	}
}

func TestLeaseDefaults(t *testing.T) {
	ctx := context.Background()
	l := lease("defaults")
	if err := cl.Create(ctx, l); err != nil {
		t.Fatal(err)
	}
	if l.Spec.TTLSeconds != 15 || l.Spec.Renewal != fencerv1.RenewalPodReady || l.Spec.Policy != fencerv1.PolicyCurrent || l.Spec.TokenDelivery != fencerv1.DeliveryPodAnnotations {
		t.Fatalf("defaults not applied: ttlSeconds=%d renewal=%q policy=%q tokenDelivery=%q", l.Spec.TTLSeconds, l.Spec.Renewal, l.Spec.Policy, l.Spec.TokenDelivery)
	}
	if l.Spec.Suspend || l.Spec.BindIdentity {
		t.Fatalf("suspend and bindIdentity must default to false")
	}
}

func TestLeaseRefusals(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name   string
		mutate func(*fencerv1.Lease)
		want   string
	}{
		{"ttl negative", func(l *fencerv1.Lease) { l.Spec.TTLSeconds = -1 }, "spec.ttlSeconds in body should be greater than or equal to 1"},
		{"ttl too long", func(l *fencerv1.Lease) { l.Spec.TTLSeconds = 3601 }, "spec.ttlSeconds in body should be less than or equal to 3600"},
		{"name of 64 characters", func(l *fencerv1.Lease) { l.Name = strings.Repeat("a", 64) }, "Lease names are limited to 63 characters"},
		{"unknown renewal", func(l *fencerv1.Lease) { l.Spec.Renewal = "Sometimes" }, `spec.renewal: Unsupported value: "Sometimes"`},
		{"unknown policy", func(l *fencerv1.Lease) { l.Spec.Policy = "Latest" }, `spec.policy: Unsupported value: "Latest"`},
		{"unknown token delivery", func(l *fencerv1.Lease) { l.Spec.TokenDelivery = "Env" }, `spec.tokenDelivery: Unsupported value: "Env"`},
		{"bad selector", func(l *fencerv1.Lease) {
			l.Spec.HolderSelector = metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: "Near"}}}
		}, "spec.holderSelector.matchExpressions: operator must be one of In, NotIn, Exists, DoesNotExist"},
		{"In without values", func(l *fencerv1.Lease) {
			l.Spec.HolderSelector = metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: "In"}}}
		}, "spec.holderSelector.matchExpressions: values must be set for In and NotIn"},
		{"Exists with values", func(l *fencerv1.Lease) {
			l.Spec.HolderSelector = metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: "Exists", Values: []string{"a"}}}}
		}, "empty for Exists and DoesNotExist"},
		{"empty selector", func(l *fencerv1.Lease) { l.Spec.HolderSelector = metav1.LabelSelector{} }, "spec.holderSelector must select something"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := lease(fmt.Sprintf("refused-%d", i))
			tc.mutate(l)
			mustBeRefused(t, cl.Create(ctx, l), tc.want)
		})
	}
	t.Run("expression selector is accepted", func(t *testing.T) {
		l := lease("expressions")
		l.Spec.HolderSelector = metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: "app", Operator: "In", Values: []string{"a", "b"}},
			{Key: "canary", Operator: "DoesNotExist"},
		}}
		if err := cl.Create(ctx, l); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("name of 63 characters is accepted", func(t *testing.T) {
		if err := cl.Create(ctx, lease(strings.Repeat("b", 63))); err != nil {
			t.Fatal(err)
		}
	})
}

func TestIDRangeCreateRefusals(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name string
		obj  func() *fencerv1.IDRange
		want string
	}{
		{"min above max", func() *fencerv1.IDRange { r := blocks("a"); r.Spec.Min = 5; r.Spec.Max = 4; return r }, "spec.min must be less than or equal to spec.max"},
		{"blocks without blockSize", func() *fencerv1.IDRange { r := blocks("b"); r.Spec.BlockSize = nil; return r }, "spec.blockSize is required when spec.mode is Blocks"},
		{"blocks with slotTTLSeconds", func() *fencerv1.IDRange { r := blocks("c"); r.Spec.SlotTTLSeconds = ptr.To[int32](5); return r }, "spec.slotTTLSeconds applies only to mode Slots"},
		{"slots with blockSize", func() *fencerv1.IDRange { r := slots("d"); r.Spec.BlockSize = ptr.To[int64](5); return r }, "spec.blockSize applies only to mode Blocks"},
		{"slots without slotTTLSeconds", func() *fencerv1.IDRange { r := slots("e"); r.Spec.SlotTTLSeconds = nil; return r }, "spec.slotTTLSeconds is required when spec.mode is Slots"},
		{"zero blockSize", func() *fencerv1.IDRange { r := blocks("f"); r.Spec.BlockSize = ptr.To[int64](0); return r }, "spec.blockSize in body should be greater than or equal to 1"},
		{"slot TTL too long", func() *fencerv1.IDRange { r := slots("g"); r.Spec.SlotTTLSeconds = ptr.To[int32](3601); return r }, "spec.slotTTLSeconds in body should be less than or equal to 3600"},
		{"empty pod selector", func() *fencerv1.IDRange { r := blocks("i"); r.Spec.PodSelector = metav1.LabelSelector{}; return r }, "spec.podSelector must select something"},
		{"name of 64 characters", func() *fencerv1.IDRange { r := blocks(strings.Repeat("i", 64)); return r }, "IDRange names are limited to 63 characters"},
		{"negative min", func() *fencerv1.IDRange { r := slots("k"); r.Spec.Min = -1000; return r }, "spec.min must be 0 or more"},
		{"max at MaxInt64", func() *fencerv1.IDRange { r := blocks("j"); r.Spec.Max = 1<<63 - 1; return r }, "spec.max must be below 9223372036854775807"},
		{"unknown mode", func() *fencerv1.IDRange { r := blocks("h"); r.Spec.Mode = "Ranges"; return r }, `spec.mode: Unsupported value: "Ranges"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			mustBeRefused(t, cl.Create(ctx, tc.obj()), tc.want)
		})
	}
}

func TestIDRangeUpdateRules(t *testing.T) {
	ctx := context.Background()
	r := blocks("updates")
	if err := cl.Create(ctx, r); err != nil {
		t.Fatal(err)
	}
	update := func(mutate func(*fencerv1.IDRange)) error {
		cur := &fencerv1.IDRange{}
		if err := cl.Get(ctx, client.ObjectKeyFromObject(r), cur); err != nil {
			t.Fatal(err)
		}
		mutate(cur)
		return cl.Update(ctx, cur)
	}
	mustBeRefused(t, update(func(r *fencerv1.IDRange) { r.Spec.Max = 999 }), "spec.max may only grow")
	mustBeRefused(t, update(func(r *fencerv1.IDRange) { r.Spec.Min = 2 }), "spec.min is immutable")
	mustBeRefused(t, update(func(r *fencerv1.IDRange) {
		r.Spec.Mode = fencerv1.ModeSlots
		r.Spec.BlockSize = nil
		r.Spec.SlotTTLSeconds = ptr.To[int32](5)
	}), "spec.mode is immutable")
	if err := update(func(r *fencerv1.IDRange) { r.Spec.Max = 2000 }); err != nil {
		t.Fatalf("growing max must be accepted: %v", err)
	}
	if err := update(func(r *fencerv1.IDRange) { r.Spec.BlockSize = ptr.To[int64](50) }); err != nil {
		t.Fatalf("changing blockSize must be accepted: %v", err)
	}
}

// TestExamplesAreAccepted creates every fencer object in examples/.
func TestWorkloadLeaseRules(t *testing.T) {
	ctx := context.Background()
	wl := func(name string) *fencerv1.WorkloadLease {
		return &fencerv1.WorkloadLease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec: fencerv1.WorkloadLeaseSpec{Workload: fencerv1.WorkloadRef{Kind: fencerv1.WorkloadStatefulSet, Name: "web"}}}
	}
	ok := wl("defaults")
	if err := cl.Create(ctx, ok); err != nil {
		t.Fatal(err)
	}
	if ok.Spec.TTLSeconds != 15 || ok.Spec.Renewal != fencerv1.RenewalPodReady || ok.Spec.Policy != fencerv1.PolicyCurrent || ok.Spec.TokenDelivery != fencerv1.DeliveryPodAnnotations {
		t.Fatalf("defaults not applied: %+v", ok.Spec)
	}
	// Names a workload can have: dotted, and a CronJob's longest, and a
	// StatefulSet's longer than a CronJob may be.
	for i, ref := range []fencerv1.WorkloadRef{
		{Kind: fencerv1.WorkloadStatefulSet, Name: "web.v2"},
		{Kind: fencerv1.WorkloadCronJob, Name: strings.Repeat("c", 52)},
		{Kind: fencerv1.WorkloadStatefulSet, Name: strings.Repeat("s", 60)},
	} {
		w := wl(fmt.Sprintf("named-%d", i))
		w.Spec.Workload = ref
		if err := cl.Create(ctx, w); err != nil {
			t.Errorf("a WorkloadLease of %s %q: %v", ref.Kind, ref.Name, err)
		}
	}
	cases := []struct {
		name   string
		mutate func(*fencerv1.WorkloadLease)
		want   string
	}{
		{"name of 64 characters", func(w *fencerv1.WorkloadLease) { w.Name = strings.Repeat("w", 64) }, "WorkloadLease names are limited to 63 characters"},
		{"unknown kind", func(w *fencerv1.WorkloadLease) { w.Spec.Workload.Kind = "Deployment" }, `spec.workload.kind: Unsupported value: "Deployment"`},
		{"no workload name", func(w *fencerv1.WorkloadLease) { w.Spec.Workload.Name = "" }, "spec.workload.name in body should be at least 1 chars long"},
		{"ttl too long", func(w *fencerv1.WorkloadLease) { w.Spec.TTLSeconds = 3601 }, "spec.ttlSeconds in body should be less than or equal to 3600"},
		{"a workload name with an underscore", func(w *fencerv1.WorkloadLease) { w.Spec.Workload.Name = "Web_Server" }, `spec.workload.name: Invalid value: "Web_Server": must be a workload's name`},
		{"a workload name with a slash", func(w *fencerv1.WorkloadLease) {
			w.Spec.Workload = fencerv1.WorkloadRef{Kind: fencerv1.WorkloadJob, Name: "a/b"}
		}, "must be a workload's name"},
		{"a CronJob name of 53 characters", func(w *fencerv1.WorkloadLease) {
			w.Spec.Workload = fencerv1.WorkloadRef{Kind: fencerv1.WorkloadCronJob, Name: strings.Repeat("c", 53)}
		}, "a CronJob's name is at most 52 characters"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := wl(fmt.Sprintf("refused-%d", i))
			tc.mutate(w)
			mustBeRefused(t, cl.Create(ctx, w), tc.want)
		})
	}
}

func TestExamplesAreAccepted(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(root, "examples", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ns := "examples"
	if err := cl.Create(ctx, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": ns},
	}}); err != nil {
		t.Fatal(err)
	}
	created := 0
	for _, f := range files {
		for _, obj := range readObjects(t, f) {
			if obj.GroupVersionKind().Group != fencerv1.GroupVersion.Group {
				continue
			}
			obj.SetNamespace(ns)
			if err := cl.Create(ctx, obj); err != nil {
				t.Errorf("%s: %s/%s refused: %v", filepath.Base(f), obj.GetKind(), obj.GetName(), err)
			}
			created++
		}
	}
	if created < 3 {
		t.Fatalf("found %d fencer objects in examples/, want at least a Lease and both IDRange modes", created)
	}
}

func readObjects(t *testing.T, path string) []*unstructured.Unstructured {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var objs []*unstructured.Unstructured
	for _, doc := range strings.Split(string(raw), "\n---") {
		if strings.TrimSpace(doc) == "" {
			continue
		}
		m := map[string]any{}
		if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if len(m) > 0 {
			objs = append(objs, &unstructured.Unstructured{Object: m})
		}
	}
	return objs
}

// TestKubectlExplain checks that `kubectl explain` documents every spec field,
// so users can learn the API from the cluster.
func TestKubectlExplain(t *testing.T) {
	admin, err := env.ControlPlane.AddUser(envtest.User{Name: "explain", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kubectl, err := admin.Kubectl()
	if err != nil {
		t.Fatal(err)
	}
	for resource, fields := range map[string][]string{
		"leases.fencer.io.spec":         {"ttlSeconds", "holderSelector", "renewal", "policy", "bindIdentity", "suspend", "tokenDelivery", "soleCandidate"},
		"workloadleases.fencer.io.spec": {"workload", "ttlSeconds", "renewal", "policy", "bindIdentity", "suspend", "tokenDelivery"},
		"idranges.fencer.io.spec":       {"mode", "min", "max", "blockSize", "podSelector", "slotTTLSeconds"},
		"leases.fencer.io.status":       {"holder", "holderUID", "token", "leaseID", "acquireTime", "renewTime", "expireTime", "transitions", "history", "observedGeneration", "conditions"},
	} {
		out, stderr, err := kubectl.Run("explain", resource)
		if err != nil {
			t.Fatalf("kubectl explain %s: %v: %s", resource, err, readAll(stderr))
		}
		text := readAll(out)
		for _, f := range fields {
			// A documented field is listed as "  <name>\t<type>" followed by an
			// indented description line.
			i := strings.Index(text, "\n  "+f+"\t")
			if i < 0 {
				t.Errorf("kubectl explain %s does not list %s:\n%s", resource, f, text)
				continue
			}
			rest := text[i+1:]
			lines := strings.SplitN(rest, "\n", 3)
			if len(lines) < 2 || strings.TrimSpace(lines[1]) == "" || strings.Contains(lines[1], "<no description>") {
				t.Errorf("kubectl explain %s: %s has no description", resource, f)
			}
		}
	}
}

func readAll(r interface{ Read([]byte) (int, error) }) string {
	var sb strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := r.Read(buf)
		sb.Write(buf[:n])
		if err != nil {
			return sb.String()
		}
	}
}
