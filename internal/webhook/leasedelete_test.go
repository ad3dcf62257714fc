package webhook

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/fencer-io/fencer/internal/etcdstore"
)

// releaseCall is one ReleaseDeleted call the fake saw.
type releaseCall struct{ namespace, name, uid string }

type fakeReleaser struct {
	calls []releaseCall
	err   error
}

func (f *fakeReleaser) ReleaseDeleted(_ context.Context, namespace, name, uid string, _ time.Time) (*etcdstore.Grant, error) {
	f.calls = append(f.calls, releaseCall{namespace, name, uid})
	return nil, f.err
}

func leaseDelete(mutate func(*admissionv1.AdmissionRequest)) admission.Request {
	req := admissionv1.AdmissionRequest{
		Operation: admissionv1.Delete, Namespace: "ns", Name: "job",
		Resource:  metav1.GroupVersionResource{Group: "fencer.io", Version: "v1alpha1", Resource: "leases"},
		OldObject: runtime.RawExtension{Raw: []byte(`{"apiVersion":"fencer.io/v1alpha1","kind":"Lease","metadata":{"name":"job","namespace":"ns","uid":"uid-1"}}`)},
	}
	if mutate != nil {
		mutate(&req)
	}
	return admission.Request{AdmissionRequest: req}
}

// The Lease deletion webhook releases the grant of the very Lease being
// deleted, and only for a real (not dry-run) DELETE of a Lease; when etcd
// cannot be reached the DELETE is refused, so the Lease stays held rather
// than gone with its grant alive.
func TestLeaseDeletionReleasesBeforeTheLeaseGoes(t *testing.T) {
	dry := true
	cases := []struct {
		name    string
		mutate  func(*admissionv1.AdmissionRequest)
		err     error
		allowed bool
		code    int32
		msg     string
		calls   []releaseCall
	}{
		{name: "a Lease's DELETE releases its grant", allowed: true, calls: []releaseCall{{"ns", "job", "uid-1"}}},
		{name: "a DeleteCollection (a namespace's deletion) names no Lease: the object does", mutate: func(r *admissionv1.AdmissionRequest) { r.Name = "" },
			allowed: true, calls: []releaseCall{{"ns", "job", "uid-1"}}},
		{name: "an object that is not the Lease named", mutate: func(r *admissionv1.AdmissionRequest) { r.Name = "other" }, code: http.StatusBadRequest,
			msg: "it names lease ns/job"},
		{name: "an object in another namespace", mutate: func(r *admissionv1.AdmissionRequest) { r.Namespace = "elsewhere" }, code: http.StatusBadRequest,
			msg: "it names lease ns/job"},
		{name: "a dry run releases nothing", mutate: func(r *admissionv1.AdmissionRequest) { r.DryRun = &dry }, allowed: true},
		{name: "another resource's DELETE releases nothing", mutate: func(r *admissionv1.AdmissionRequest) {
			r.Resource = metav1.GroupVersionResource{Group: "coordination.k8s.io", Version: "v1", Resource: "leases"}
		}, allowed: true},
		{name: "another resource of fencer.io's group releases nothing", mutate: func(r *admissionv1.AdmissionRequest) {
			r.Resource = metav1.GroupVersionResource{Group: "fencer.io", Version: "v1alpha1", Resource: "workloadleases"}
		}, allowed: true},
		{name: "an UPDATE releases nothing", mutate: func(r *admissionv1.AdmissionRequest) { r.Operation = admissionv1.Update }, allowed: true},
		{name: "a subresource releases nothing", mutate: func(r *admissionv1.AdmissionRequest) { r.SubResource = "status" }, allowed: true},
		{name: "no old object", mutate: func(r *admissionv1.AdmissionRequest) { r.OldObject.Raw = nil }, code: http.StatusBadRequest,
			msg: "the DELETE of lease ns/job came without a readable Lease object (oldObject)"},
		{name: "an old object with no UID", mutate: func(r *admissionv1.AdmissionRequest) {
			r.OldObject.Raw = []byte(`{"metadata":{"name":"job","namespace":"ns"}}`)
		}, code: http.StatusBadRequest,
			msg: "cannot tell which Lease's grant to release"},
		{name: "etcd unreachable", err: errors.New("context deadline exceeded"), code: http.StatusServiceUnavailable, calls: []releaseCall{{"ns", "job", "uid-1"}},
			msg: "fencer: cannot release the grant of lease ns/job in etcd before it is deleted (context deadline exceeded); the delete is refused"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			store := &fakeReleaser{err: tc.err}
			resp := (&LeaseDeletion{Store: store}).Handle(context.Background(), leaseDelete(tc.mutate))
			if resp.Allowed != tc.allowed {
				t.Fatalf("allowed %v, want %v: %+v", resp.Allowed, tc.allowed, resp.Result)
			}
			if !tc.allowed && (resp.Result.Code != tc.code || !strings.Contains(resp.Result.Message, tc.msg)) {
				t.Fatalf("refused with %d %q, want %d containing %q", resp.Result.Code, resp.Result.Message, tc.code, tc.msg)
			}
			if len(store.calls) != len(tc.calls) || (len(tc.calls) > 0 && store.calls[0] != tc.calls[0]) {
				t.Fatalf("released %v, want %v", store.calls, tc.calls)
			}
		})
	}
}

// FuzzLeaseDeletionOldObject: whatever bytes the old object holds, the
// webhook never panics, and it releases a grant only for the UID the
// object names, or refuses with a 400 that says why.
func FuzzLeaseDeletionOldObject(f *testing.F) {
	for _, seed := range []string{`{"metadata":{"uid":"u","name":"job","namespace":"ns"}}`, `{"metadata":{"uid":"u"}}`, `{"metadata":{"UID":"u"}}`, `{"metadata":{}}`, `null`, `{`, `[]`, `{"metadata":{"uid":7}}`, ``} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		store := &fakeReleaser{}
		resp := (&LeaseDeletion{Store: store}).Handle(context.Background(), leaseDelete(func(r *admissionv1.AdmissionRequest) { r.OldObject.Raw = raw }))
		switch {
		case resp.Allowed:
			if len(store.calls) != 1 || store.calls[0].uid == "" || store.calls[0].namespace != "ns" || store.calls[0].name != "job" {
				t.Fatalf("allowed after releasing %v", store.calls)
			}
		case resp.Result.Code != http.StatusBadRequest || !strings.Contains(resp.Result.Message, "cannot tell which Lease's grant to release") || len(store.calls) != 0:
			t.Fatalf("refused with %d %q after releasing %v", resp.Result.Code, resp.Result.Message, store.calls)
		}
	})
}
