package controllers

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
)

// A new leader's cache can lag the apiserver: it still shows Lease "l" as
// the object deleted a moment ago (UID old), while the apiserver has the
// Lease created again under the name (UID new), and etcd holds the new
// Lease's grant. Neither pass over the stale object may release that
// grant: not the grant pass, which takes a grant of another UID for a
// predecessor's, and not the finalize pass of the deleted object. (Both
// did: the holder's tenure ended early, its token changed across a
// failover.)
func TestAStaleCacheNeverReleasesTheGrantOfTheLeaseCreatedAgain(t *testing.T) {
	for _, tc := range []struct {
		name     string
		deleting bool
	}{
		{"the grant pass", false},
		{"the finalize pass", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, store, elector := storeWithTerm(t)
			ctx := context.Background()
			g, err := store.GrantLease(ctx, "ns", "l", "new", "p", "uid-p", 30*time.Second, time.Now())
			if err != nil || g == nil {
				t.Fatalf("granting the new Lease: %v, %v", g, err)
			}
			stale := &fencerv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "l", UID: "old", Generation: 1,
				Finalizers: []string{fencerv1.LeaseFinalizer}}, Spec: fencerv1.LeaseSpec{TTLSeconds: 30}}
			if tc.deleting {
				stale.DeletionTimestamp = &metav1.Time{Time: time.Now()}
			}
			current := &fencerv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "l", UID: "new", Generation: 1,
				Finalizers: []string{fencerv1.LeaseFinalizer}}, Spec: fencerv1.LeaseSpec{TTLSeconds: 30}}
			cache := fake.NewClientBuilder().WithScheme(apiScheme(t)).WithStatusSubresource(&fencerv1.Lease{}).WithIndex(&corev1.Pod{}, indexPodLease, podLeaseValues).WithObjects(stale).Build()
			api := fake.NewClientBuilder().WithScheme(apiScheme(t)).WithStatusSubresource(&fencerv1.Lease{}).WithIndex(&corev1.Pod{}, indexPodLease, podLeaseValues).WithObjects(current).Build()
			r := NewLeaseReconciler(cache, store, elector, nil, clock.RealClock{})
			// The stale copy was confirmed earlier in this term, while it
			// was the API's too (the Lease was deleted and created again
			// since): the stale-cache look lets it pass, and only the
			// apiserver's word on the grant's Lease stands between it and
			// the successor's grant.
			if behind, err := r.stale.behindInTerm(ctx, elector, cache, &fencerv1.LeaseList{}, stale); err != nil || behind {
				t.Fatalf("confirming the copy while it was current: behind %v, %v", behind, err)
			}
			r.APIReader = api
			if tc.deleting {
				if _, err := r.finalize(ctx, stale); err != nil {
					t.Logf("finalize: %v", err) // its finalizer write may fail: the object it read is gone
				}
			} else if _, err := r.reconcileGrant(ctx, stale); err != nil {
				t.Fatalf("reconcileGrant: %v", err)
			}
			now, err := store.GetGrant(ctx, "ns", "l")
			if err != nil {
				t.Fatal(err)
			}
			if now == nil || now.Token != g.Token {
				t.Fatalf("etcd holds %+v after a pass over the stale Lease; want the new Lease's grant, token %d, kept", now, g.Token)
			}
		})
	}
}

// The same passes over a cache that is right release what they should: a
// grant recorded for an earlier Lease of the name is dropped by the grant
// pass, and a deleted Lease's own grant by its finalize pass.
func TestACurrentCacheReleasesThePredecessorsAndTheDeletedLeasesGrant(t *testing.T) {
	for _, tc := range []struct {
		name     string
		grantUID string
		deleting bool
	}{
		{"the grant pass, a predecessor's grant", "old", false},
		{"the finalize pass, the Lease's own grant", "l-uid", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, store, elector := storeWithTerm(t)
			ctx := context.Background()
			if _, err := store.GrantLease(ctx, "ns", "l", tc.grantUID, "p", "uid-p", 30*time.Second, time.Now()); err != nil {
				t.Fatal(err)
			}
			lease := &fencerv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "l", UID: "l-uid", Generation: 1,
				Finalizers: []string{fencerv1.LeaseFinalizer}}, Spec: fencerv1.LeaseSpec{TTLSeconds: 30}}
			if tc.deleting {
				lease.DeletionTimestamp = &metav1.Time{Time: time.Now()}
			}
			c := fake.NewClientBuilder().WithScheme(apiScheme(t)).WithStatusSubresource(&fencerv1.Lease{}).WithIndex(&corev1.Pod{}, indexPodLease, podLeaseValues).WithObjects(lease.DeepCopy()).Build()
			r := NewLeaseReconciler(c, store, elector, nil, clock.RealClock{})
			r.APIReader = c
			if err := c.Get(ctx, client.ObjectKeyFromObject(lease), lease); err != nil {
				t.Fatal(err) // the copy the cache holds, as current as the API's
			}
			var err error
			if tc.deleting {
				_, err = r.finalize(ctx, lease)
			} else {
				_, err = r.reconcileGrant(ctx, lease)
			}
			if err != nil {
				t.Fatal(err)
			}
			if now, err := store.GetGrant(ctx, "ns", "l"); err != nil || now != nil {
				t.Fatalf("etcd holds %+v (%v); want the grant released", now, err)
			}
		})
	}
}

// The finalize pass of a Lease the apiserver confirms is the object of
// its name releases a grant recorded for an earlier Lease of the name too
// (one deleted while no manager ran, replaced with kubectl replace
// --force): no grant pass runs for a Lease being deleted, so while its
// delete waits on another finalizer the predecessor's grant lived on, and
// its holder's etcd and database fences kept committing under it. Only a
// grant of the Lease the apiserver now has under the name stays.
func TestTheFinalizePassReleasesAPredecessorsGrant(t *testing.T) {
	_, store, elector := storeWithTerm(t)
	ctx := context.Background()
	if _, err := store.GrantLease(ctx, "ns", "l", "old", "p", "uid-p", 30*time.Second, time.Now()); err != nil {
		t.Fatal(err)
	}
	lease := &fencerv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "l", UID: "l-uid", Generation: 1,
		DeletionTimestamp: &metav1.Time{Time: time.Now()}, Finalizers: []string{fencerv1.LeaseFinalizer, "example.com/hold"}},
		Spec: fencerv1.LeaseSpec{TTLSeconds: 30}}
	c := fake.NewClientBuilder().WithScheme(apiScheme(t)).WithStatusSubresource(&fencerv1.Lease{}).WithIndex(&corev1.Pod{}, indexPodLease, podLeaseValues).
		WithObjects(lease.DeepCopy()).Build()
	r := NewLeaseReconciler(c, store, elector, nil, clock.RealClock{})
	r.APIReader = c
	if _, err := r.finalize(ctx, lease); err != nil {
		t.Fatal(err)
	}
	if g, err := store.GetGrant(ctx, "ns", "l"); err != nil || g != nil {
		t.Fatalf("etcd holds %+v (%v) after the finalize of the Lease of the name: want the predecessor's grant released", g, err)
	}
}

// A Lease whose deletion waits on another finalizer: its status is written
// (grant released) in one pass and fencer's finalizer dropped in the next,
// from the Lease as it is then. Both in one pass, the update dropping the
// finalizer undid a label edited meanwhile: the status write, retried onto
// the fresh Lease, made the pass's stale copy look current.
func TestTheFinalizerGoesAfterTheReleasedStatusFromAFreshLease(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := fencerv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	now := metav1.Now()
	l := &fencerv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "job", Namespace: "ns", UID: "u1",
		Labels: map[string]string{"team": "a"}, DeletionTimestamp: &now,
		Finalizers: []string{fencerv1.LeaseFinalizer, "example.com/keep"}},
		Status: fencerv1.LeaseStatus{Holder: "w-0", HolderUID: "p1", Token: 42,
			History: []fencerv1.Tenure{{Holder: "w-0", HolderUID: "p1", Token: 42, Start: metav1.NowMicro()}}}}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(l).WithStatusSubresource(&fencerv1.Lease{}).WithInterceptorFuncs(interceptor.Funcs{
		SubResourceUpdate: func(ctx context.Context, cl client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			cur := &fencerv1.Lease{}
			if err := cl.Get(ctx, client.ObjectKeyFromObject(obj), cur); err != nil {
				return err
			}
			if cur.ResourceVersion != obj.GetResourceVersion() { // as the apiserver
				return apierrors.NewConflict(schema.GroupResource{Group: "fencer.io", Resource: "leases"}, obj.GetName(), errors.New("the object has been modified; please apply your changes to the latest version and try again"))
			}
			return cl.SubResource(sub).Update(ctx, obj, opts...)
		},
	}).Build()
	ctx := context.Background()
	stale := &fencerv1.Lease{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(l), stale); err != nil {
		t.Fatal(err)
	}
	edit := stale.DeepCopy()
	edit.Labels["team"] = "b"
	if err := c.Update(ctx, edit); err != nil {
		t.Fatal(err)
	}
	r := &LeaseReconciler{Client: c, Clock: clocktesting.NewFakeClock(time.Now())}
	res, err := r.afterRelease(ctx, stale)
	if err != nil || res.RequeueAfter == 0 {
		t.Fatalf("the pass that writes the status: %+v, %v; want a requeue", res, err)
	}
	got := &fencerv1.Lease{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(l), got); err != nil {
		t.Fatal(err)
	}
	if got.Status.Holder != "" || got.Status.Token != 0 || got.Labels["team"] != "b" || !slices.Contains(got.Finalizers, fencerv1.LeaseFinalizer) {
		t.Fatalf("after the first pass: holder %q token %d labels %v finalizers %v; want the status released, the label edit kept, fencer's finalizer still there",
			got.Status.Holder, got.Status.Token, got.Labels, got.Finalizers)
	}
	if _, err := r.afterRelease(ctx, got); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(l), got); err != nil {
		t.Fatal(err)
	}
	if got.Labels["team"] != "b" || slices.Contains(got.Finalizers, fencerv1.LeaseFinalizer) {
		t.Fatalf("after the second pass: labels %v finalizers %v; want the label edit kept and fencer's finalizer gone", got.Labels, got.Finalizers)
	}
}
