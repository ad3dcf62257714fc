package lease

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/pkg/fence"
)

// tokenDelivery: LeaseStatus. A Lease switched to it takes its annotations
// off the holder, a new holder is never annotated, and the SDK's
// LeaseSource reads the token and etcd lease ID from the status, for the
// holder's pod name and UID only. (Renewal PodReady: the controller keeps
// the grant alive while the test looks.)
func TestTokenDeliveryThroughTheLeaseStatus(t *testing.T) {
	startController(t, "c1")
	ctx := context.Background()
	ns := namespace(t)
	w0 := readyPod(t, ns, "w-0", "w")
	w1 := readyPod(t, ns, "w-1", "w")
	create(t, newLease(ns, "job", "w", 15))
	st := heldBy(t, ns, "job")
	if st.Holder != "w-0" {
		t.Fatalf("holder %s, want w-0", st.Holder)
	}
	eventually(t, 30*time.Second, "w-0's token annotation (the default delivery)", func() error {
		if got := annotation(t, ns, "w-0", "job"); got != itoa(st.Token) {
			return fmt.Errorf("annotation %q, want %d", got, st.Token)
		}
		return nil
	})

	patch := fmt.Sprintf(`{"spec":{"tokenDelivery":%q}}`, fencerv1.DeliveryLeaseStatus)
	if err := k8s.Patch(ctx, &fencerv1.Lease{ObjectMeta: metaOf(ns, "job")}, client.RawPatch("application/merge-patch+json", []byte(patch))); err != nil {
		t.Fatal(err)
	}
	noAnnotation(t, ns, "w-0", "job")
	src := fence.LeaseSource{Client: k8s, Namespace: ns, Lease: "job", Pod: "w-0", UID: w0.UID}
	tok, err := src.Token(ctx)
	// Under PodReady the status's etcd lease is the controller's, renewed
	// while the pod is Ready: a token carries no lease ID for Hold to renew.
	if err != nil || tok.Value != st.Token || tok.LeaseID != 0 || st.LeaseID == 0 {
		t.Fatalf("LeaseSource for w-0: %+v, %v; want token %d and no lease ID (the status's is %d)", tok, err, st.Token, st.LeaseID)
	}

	// The holder goes: w-1 gets the grant, and no annotation, while the
	// status names it; w-0 reads that it holds nothing.
	setReady(t, w0, false)
	next := heldBy(t, ns, "job", "w-0")
	if next.Holder != "w-1" || next.Token <= st.Token {
		t.Fatalf("after w-0: %+v", next)
	}
	if tok, err := (fence.LeaseSource{Client: k8s, Namespace: ns, Lease: "job", Pod: "w-1", UID: w1.UID}).Token(ctx); err != nil || tok.Value != next.Token {
		t.Fatalf("LeaseSource for w-1: %+v, %v; want token %d", tok, err, next.Token)
	}
	if _, err := src.Token(ctx); err == nil {
		t.Fatal("LeaseSource for w-0 still reads a token after w-1 was granted")
	}
	// The annotation would follow the status write within milliseconds;
	// watch for one for a while.
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if got := annotation(t, ns, "w-1", "job"); got != "" {
			t.Fatalf("w-1 was annotated with token %q under tokenDelivery LeaseStatus", got)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A WorkloadLease's tokenDelivery is its members'.
func TestWorkloadLeaseSetsItsMembersTokenDelivery(t *testing.T) {
	startController(t, "c1")
	ns := namespace(t)
	create(t, statefulSet(ns, "web", 1))
	wl := workloadLease(ns, "web", fencerv1.WorkloadStatefulSet, "web", fencerv1.RenewalPodReady)
	wl.Spec.TokenDelivery = fencerv1.DeliveryLeaseStatus
	create(t, wl)
	if got := memberLeases(t, ns, wl, "web-0")["web-0"].Spec.TokenDelivery; got != fencerv1.DeliveryLeaseStatus {
		t.Fatalf("web-0's tokenDelivery %q, want LeaseStatus", got)
	}
}

// A Lease whose deletion waits on a finalizer other than fencer's (a
// tool's) outlives the release of its grant: its status must say so, or a
// pod reading it (tokenDelivery LeaseStatus) would go on holding a token
// etcd no longer has for as long as the deletion waits.
func TestALeaseWhoseDeletionWaitsShowsItsGrantReleased(t *testing.T) {
	startController(t, "c1")
	ctx := context.Background()
	ns := namespace(t)
	w0 := readyPod(t, ns, "w-0", "w")
	l := newLease(ns, "job", "w", 15)
	l.Spec.TokenDelivery = fencerv1.DeliveryLeaseStatus
	l.Finalizers = []string{"example.com/keep"}
	create(t, l)
	st := heldBy(t, ns, "job")
	src := fence.LeaseSource{Client: k8s, Namespace: ns, Lease: "job", Pod: "w-0", UID: w0.UID}
	if tok, err := src.Token(ctx); err != nil || tok.Value != st.Token {
		t.Fatalf("LeaseSource for w-0 while held: %+v, %v; want token %d", tok, err, st.Token)
	}
	if err := k8s.Delete(ctx, &fencerv1.Lease{ObjectMeta: metaOf(ns, "job")}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the status of the Lease being deleted to show its grant released", func() error {
		got := getLease(t, ns, "job")
		if got.DeletionTimestamp.IsZero() {
			return fmt.Errorf("not being deleted yet")
		}
		if etcdToken(t, ns, "job") != 0 {
			return fmt.Errorf("etcd still has the grant")
		}
		if got.Status.Holder != "" || got.Status.Token != 0 || got.Status.OpenTenure() != nil || heldReason(got) != fencerv1.ReasonDeleting {
			return fmt.Errorf("status holder %q token %d, open tenure %+v, Held %s", got.Status.Holder, got.Status.Token, got.Status.OpenTenure(), heldReason(got))
		}
		if last := got.Status.LastTenure(); last == nil || last.Token != st.Token || last.EndReason != fencerv1.TenureDeleted {
			return fmt.Errorf("last tenure %+v, want token %d ended Deleted", last, st.Token)
		}
		return nil
	})
	if tok, err := src.Token(ctx); err == nil {
		t.Fatalf("LeaseSource for w-0 reads token %+v from a Lease whose grant is released", tok)
	}
	got := getLease(t, ns, "job")
	if slices.Contains(got.Finalizers, fencerv1.LeaseFinalizer) {
		t.Errorf("fencer's finalizer stays on the released Lease: %v", got.Finalizers)
	}
	got.Finalizers = nil
	if err := k8s.Update(ctx, got); err != nil {
		t.Fatal(err)
	}
}
