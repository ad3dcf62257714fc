package webhook

import (
	"context"
	"encoding/json"
	"slices"
	"testing"

	jsonpatchapply "github.com/evanphx/json-patch/v5"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
)

func leaseCreate(object string, mutate func(*admissionv1.AdmissionRequest)) admission.Request {
	req := admissionv1.AdmissionRequest{
		Operation: admissionv1.Create, Namespace: "ns", Name: "job",
		Resource: metav1.GroupVersionResource{Group: "fencer.io", Version: "v1alpha1", Resource: "leases"},
		Object:   runtime.RawExtension{Raw: []byte(object)},
	}
	if mutate != nil {
		mutate(&req)
	}
	return admission.Request{AdmissionRequest: req}
}

// finalizersAfter applies the webhook's response to the request's object,
// as the apiserver does, and returns the stored Lease's finalizers.
func finalizersAfter(t *testing.T, req admission.Request, resp admission.Response) []string {
	t.Helper()
	if !resp.Allowed {
		t.Fatalf("the Lease's CREATE was refused: %+v", resp.Result)
	}
	obj := req.Object.Raw
	if len(resp.Patches) > 0 {
		raw, err := appendPatch(nil, resp.Patches)
		if err != nil {
			t.Fatal(err)
		}
		patch, err := jsonpatchapply.DecodePatch(raw)
		if err != nil {
			t.Fatalf("the webhook's patch %s is not a JSON Patch: %v", raw, err)
		}
		if obj, err = patch.Apply(obj); err != nil {
			t.Fatalf("the webhook's patch %s does not apply to %s: %v", raw, req.Object.Raw, err)
		}
	}
	var lease fencerv1.Lease
	if err := json.Unmarshal(obj, &lease); err != nil {
		t.Fatal(err)
	}
	return lease.Finalizers
}

// A Lease is created with fencer's finalizer, after any the client sent,
// and only where the controller would give it one; the webhook never
// refuses a Lease, and patches nothing else.
func TestLeaseFinalizerWebhookAddsTheFinalizerAtCreate(t *testing.T) {
	const bare = `{"apiVersion":"fencer.io/v1alpha1","kind":"Lease","metadata":{"name":"job","namespace":"ns"}}`
	onlyIn := func(ns string) func(string) bool { return func(n string) bool { return n == ns } }
	cases := []struct {
		name     string
		object   string
		mutate   func(*admissionv1.AdmissionRequest)
		finalize func(string) bool
		want     []string
		// unpatched: an object the webhook cannot read, admitted as sent.
		unpatched bool
	}{
		{name: "a Lease with no finalizers gets fencer's", object: bare, want: []string{fencerv1.LeaseFinalizer}},
		{name: "finalizers: null", object: `{"metadata":{"name":"job","finalizers":null}}`, want: []string{fencerv1.LeaseFinalizer}},
		{name: "finalizers: []", object: `{"metadata":{"name":"job","finalizers":[]}}`, want: []string{fencerv1.LeaseFinalizer}},
		{name: "the client's own finalizers are kept, fencer's after them", object: `{"metadata":{"name":"job","finalizers":["example.com/audit"]}}`,
			want: []string{"example.com/audit", fencerv1.LeaseFinalizer}},
		{name: "a Lease that already carries it is left as sent", object: `{"metadata":{"name":"job","finalizers":["fencer.io/release","example.com/audit"]}}`,
			want: []string{fencerv1.LeaseFinalizer, "example.com/audit"}},
		{name: "a namespace the controller does not finalize (--lease-delete-webhook) gets none", object: bare, finalize: onlyIn("kube-system")},
		{name: "a namespace it does finalize", object: bare, finalize: onlyIn("ns"), want: []string{fencerv1.LeaseFinalizer}},
		{name: "an UPDATE is not touched: a finalizer removed later is the controller's to restore", object: bare,
			mutate: func(r *admissionv1.AdmissionRequest) { r.Operation = admissionv1.Update }},
		{name: "another resource named leases", object: bare,
			mutate: func(r *admissionv1.AdmissionRequest) { r.Resource.Group = "coordination.k8s.io" }},
		{name: "a subresource", object: bare, mutate: func(r *admissionv1.AdmissionRequest) { r.SubResource = "status" }},
		{name: "a Lease fencer cannot read is admitted as sent", object: `{"metadata":{"finalizers":"fencer.io/release"}}`, unpatched: true},
		{name: "a Lease with no metadata is admitted as sent", object: `{"Metadata":{"Finalizers":["fencer.io/release"]}}`, unpatched: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req := leaseCreate(c.object, c.mutate)
			resp := (&LeaseFinalizer{Finalize: c.finalize}).Handle(context.Background(), req)
			if c.unpatched {
				if !resp.Allowed || len(resp.Patches) != 0 {
					t.Fatalf("got %+v; want the Lease admitted, unpatched", resp)
				}
				return
			}
			if got := finalizersAfter(t, req, resp); !slices.Equal(got, c.want) {
				t.Errorf("stored finalizers %v; want %v", got, c.want)
			}
		})
	}
}

// Whatever object a CREATE carries, the webhook admits it, and a patch it
// returns applies to that object and leaves fencer's finalizer on it once.
func FuzzLeaseFinalizerWebhook(f *testing.F) {
	for _, s := range []string{`{"metadata":{"name":"job"}}`, `{"metadata":{"finalizers":null}}`, `{"metadata":{"finalizers":["a","fencer.io/release"]}}`,
		`{"metadata":{"finalizers":["a"]}}`, `{"metadata":null}`, `[]`, `{"metadata":{"finalizers":[1]}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, object []byte) {
		req := leaseCreate(string(object), nil)
		resp := (&LeaseFinalizer{}).Handle(context.Background(), req)
		if !resp.Allowed {
			t.Fatalf("refused %q: %+v", object, resp.Result)
		}
		if len(resp.Patches) == 0 {
			return
		}
		n := 0
		for _, fin := range finalizersAfter(t, req, resp) {
			if fin == fencerv1.LeaseFinalizer {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("%q: fencer's finalizer %d times after the patch", object, n)
		}
	})
}
