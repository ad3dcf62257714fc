package controllers

import (
	"context"
	"errors"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
)

// TestStatusWriteOnADeletedObjectIsAQuietRetry: a Lease deleted while its
// reconcile ran (kubectl delete, its namespace going away) fails the
// status write with NotFound. Like a conflict, that is the cache being
// behind, not a failure: the reconcile asks to run again at once, and that
// run's read finds the Lease gone and releases what it held. Returned as an
// error, it was logged as a "Reconciler error" and counted in
// controller_runtime_reconcile_errors_total. Either way the Events and the
// pod annotations of an unwritten status stay unsent.
func TestStatusWriteOnADeletedObjectIsAQuietRetry(t *testing.T) {
	res, sent, err := finishWith(t, false, nil)
	if err != nil {
		t.Fatalf("finish on a deleted Lease: %v, want no error (a quiet retry)", err)
	}
	if res.RequeueAfter <= 0 {
		t.Fatalf("finish on a deleted Lease: %+v, want a retry, whose read finds the Lease gone", res)
	}
	if sent != "" {
		t.Fatalf("finish on a deleted Lease sent %s, though the status was not written", sent)
	}
}

// TestStatusWriteFailureIsAnError: any other failure of the status write
// goes to the workqueue's backoff, logged, NotFound answers included that do
// not mean the Lease was deleted: a CRD applied without its status
// subresource answers each status write with a NotFound naming the Lease,
// which is still there; an API version no longer served (or a deleted CRD)
// answers every request, the uncached read too, with a bare 404 page, which
// client-go names after the Lease as well. A quiet retry would hide them,
// and run every 100 ms for ever.
func TestStatusWriteFailureIsAnError(t *testing.T) {
	leases := schema.GroupResource{Group: "fencer.io", Resource: "leases"}
	for _, tc := range []struct {
		name     string
		exists   bool
		writeErr error
	}{
		{"etcd down", false, apierrors.NewServiceUnavailable("etcd is down")},
		{"no status subresource", true, apierrors.NewNotFound(leases, "l")},
		// what client-go's rest.Request makes of a 404 page
		{"a version not served", false, apierrors.NewGenericServerResponse(404, "PUT", leases, "l", "404 page not found", 0, true)},
		// an admission webhook refusing the controller's status write, as
		// fencer's fencing webhook did to a Lease labelled fencer.io/lease
		// before it skipped fencer's own kinds
		{"a webhook's 409", true, &apierrors.StatusError{ErrStatus: metav1.Status{
			Status: metav1.StatusFailure, Code: 409, Reason: metav1.StatusReasonConflict,
			Message: `admission webhook "fenced.fencer.io" denied the request: fencer: this write sends no fencing token`,
			Details: &metav1.StatusDetails{Causes: []metav1.StatusCause{{Type: fencerv1.CauseReason, Message: "MissingToken"}}},
		}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, sent, err := finishWith(t, tc.exists, tc.writeErr)
			if err == nil || err.Error() != tc.writeErr.Error() {
				t.Fatalf("finish whose status write failed with %v: %+v, %v; want that error back", tc.writeErr, res, err)
			}
			if sent != "" {
				t.Fatalf("finish sent %s, though the status was not written", sent)
			}
		})
	}
}

// TestStatusWriteConflictIsAQuietRetry: a status write that another
// writer got ahead of (the API server's conflict on the Lease) is retried
// quietly, as the cache catches up.
func TestStatusWriteConflictIsAQuietRetry(t *testing.T) {
	conflict := apierrors.NewConflict(schema.GroupResource{Group: "fencer.io", Resource: "leases"}, "l", errors.New("the object has been modified"))
	res, sent, err := finishWith(t, true, conflict)
	if err != nil || res.RequeueAfter <= 0 {
		t.Fatalf("finish whose status write conflicted: %+v, %v; want a quiet retry", res, err)
	}
	if sent != "" {
		t.Fatalf("finish sent %s, though the status was not written", sent)
	}
}

// TestStatusWriteLandsOnlyOnTheObjectItWasComputedFor: a status write
// that conflicts only because the Lease's metadata changed is written onto
// the fresh object, but never onto another object of the same name. A
// Lease deleted and created again between its grant and the status write
// (no finalizer under --lease-delete-webhook, a WorkloadLease re-creating a
// member, a deposed replica's late write) has generation 1 and an empty
// status, as its predecessor had: the predecessor's grant written onto it,
// and its token published to the holder pod, would record a grant etcd
// never made for this Lease.
func TestStatusWriteLandsOnlyOnTheObjectItWasComputedFor(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := fencerv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name       string
		storedUID  string
		wantStatus bool
	}{
		{"the same Lease, its labels changed", "a", true},
		{"a Lease created again under the name", "b", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stored := &fencerv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "l", Namespace: "ns", UID: types.UID(tc.storedUID), Generation: 1,
				Labels: map[string]string{"touched": "yes"}}}
			c := fake.NewClientBuilder().WithScheme(scheme).WithStatusSubresource(&fencerv1.Lease{}).WithObjects(stored).Build()
			// What the reconcile read: Lease UID a, before the label was set
			// (or before it was deleted), at an older resourceVersion.
			read := &fencerv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "l", Namespace: "ns", UID: "a", Generation: 1, ResourceVersion: "1"}}
			read.SetGroupVersionKind(schema.GroupVersionKind{Group: "fencer.io", Version: "v1alpha1", Kind: "Lease"})
			before := read.Status.DeepCopy()
			read.Status.ObservedGeneration, read.Status.Holder, read.Status.Token = 1, "p", 7

			published := false
			out := outcome{afterStatus: func(context.Context) error { published = true; return nil }}
			if _, err := finish(context.Background(), apiClientOf(c, nil), events.NewFakeRecorder(10), read, before, &read.Status, out); err != nil {
				t.Fatalf("finish: %v", err)
			}
			now := &fencerv1.Lease{}
			if err := c.Get(context.Background(), client.ObjectKey{Namespace: "ns", Name: "l"}, now); err != nil {
				t.Fatal(err)
			}
			if written := now.Status.Token == 7; written != tc.wantStatus || published != tc.wantStatus {
				t.Fatalf("the stored Lease (UID %s) has token %d, the pod was published to: %v; want the status written and published: %v",
					now.UID, now.Status.Token, published, tc.wantStatus)
			}
		})
	}
}

// finishWith runs finish with a changed status for a Lease, which the API
// server has if exists. The status write fails with writeErr when that is
// set. It returns finish's result and what finish sent that it must send
// only after the status is written.
func finishWith(t *testing.T, exists bool, writeErr error) (ctrl.Result, string, error) {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := fencerv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	lease := &fencerv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "l", Namespace: "ns", UID: "u"}}
	lease.SetGroupVersionKind(schema.GroupVersionKind{Group: "fencer.io", Version: "v1alpha1", Kind: "Lease"})
	b := fake.NewClientBuilder().WithScheme(scheme).WithStatusSubresource(&fencerv1.Lease{})
	if exists {
		b = b.WithObjects(lease.DeepCopy())
	}
	if writeErr != nil {
		b = b.WithInterceptorFuncs(interceptor.Funcs{
			SubResourceUpdate: func(context.Context, client.Client, string, client.Object, ...client.SubResourceUpdateOption) error {
				return writeErr
			},
			Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
				if apierrors.IsNotFound(writeErr) && !exists {
					return writeErr // the path is not served: reads get the same answer
				}
				return c.Get(ctx, key, obj, opts...)
			},
		})
	}
	before := lease.Status.DeepCopy()
	lease.Status.ObservedGeneration = 1
	lease.Status.Holder = "p"
	lease.Status.Token = 7

	annotated := false
	out := outcome{afterStatus: func(context.Context) error { annotated = true; return nil }}
	eventGranted(&out, "p")
	rec := events.NewFakeRecorder(10)
	res, err := finish(context.Background(), apiClientOf(b.Build(), nil), rec, lease, before, &lease.Status, out)
	switch {
	case annotated:
		return res, "the pod annotations", err
	case len(rec.Events) > 0:
		return res, "the Event " + <-rec.Events, err
	}
	return res, "", err
}

// TestDropFinalizerOnADeletedObjectIsAQuietRetry: a finalize pass that ran
// on a cache still showing a Lease whose finalizer an earlier pass removed
// (so the API server completed the delete) finds it gone when it removes
// the finalizer. Nothing is left to do, and it is not a reconcile error;
// the finalizer of a Lease still there is removed, and the delete
// completes.
func TestDropFinalizerOnADeletedObjectIsAQuietRetry(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := fencerv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	deleting := func() *fencerv1.Lease {
		return &fencerv1.Lease{ObjectMeta: metav1.ObjectMeta{
			Name: "l", Namespace: "ns", UID: "u",
			Finalizers:        []string{fencerv1.LeaseFinalizer},
			DeletionTimestamp: &metav1.Time{Time: time.Unix(1, 0)},
		}}
	}
	ctx := context.Background()

	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(deleting()).Build()
	stale := deleting()
	if err := c.Get(ctx, client.ObjectKeyFromObject(stale), stale); err != nil {
		t.Fatal(err)
	}
	if _, err := dropFinalizer(ctx, apiClientOf(c, nil), stale.DeepCopy(), fencerv1.LeaseFinalizer); err != nil {
		t.Fatalf("dropping the finalizer of a Lease being deleted: %v", err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(stale), &fencerv1.Lease{}); !apierrors.IsNotFound(err) {
		t.Fatalf("after its finalizer was dropped, Get of the Lease: %v, want NotFound (the delete completed)", err)
	}

	res, err := dropFinalizer(ctx, apiClientOf(c, nil), stale, fencerv1.LeaseFinalizer)
	if err != nil {
		t.Fatalf("dropping the finalizer again, from the stale cache's copy: %v, want no error (a quiet retry)", err)
	}
	if res.RequeueAfter <= 0 {
		t.Fatalf("dropping the finalizer again: %+v, want a retry, whose read finds the Lease gone", res)
	}
}
