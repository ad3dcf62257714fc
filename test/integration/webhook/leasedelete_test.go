package webhook

import (
	"context"
	"fmt"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/internal/etcdstore"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
	"github.com/fencer-io/fencer/test/support/framework"
)

// A Lease carries no finalizer, yet it is never gone while its grant lives:
// fencer's webhook releases the grant in etcd as the apiserver admits the
// Lease's DELETE, so by the time `kubectl delete` returns, etcd holds no
// grant of it and the old holder's write is refused, whatever the
// webhook's view of the Lease still shows. A dry run releases nothing. The
// Lease created again under the name grants afresh, with a greater token.
func TestLeaseDeleteReleasesTheGrantBeforeItReturns(t *testing.T) {
	ns, tok := fencedOut(t, nil)
	ctx := context.Background()
	store := etcdstore.NewStore(fx.EtcdCli, etcdkeys.DefaultPrefix, nil, nil)
	lease := &fencerv1.Lease{}
	if err := fx.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "report"}, lease); err != nil {
		t.Fatal(err)
	}
	if len(lease.Finalizers) != 0 {
		t.Fatalf("the Lease carries finalizers %v; fencer adds none", lease.Finalizers)
	}

	if err := fx.Client.Delete(ctx, lease.DeepCopy(), client.DryRunAll); err != nil {
		t.Fatalf("a dry-run delete: %v", err)
	}
	if g, err := store.GetGrant(ctx, ns, "report"); err != nil || g == nil || g.Token != tok {
		t.Fatalf("after a dry-run delete etcd holds %+v (%v); want the grant with token %d untouched", g, err, tok)
	}
	if err := write(fx.Client, ns, tok, "before"); err != nil {
		t.Fatalf("the holder's write before the delete: %v", err)
	}

	if err := fx.Client.Delete(ctx, lease.DeepCopy()); err != nil {
		t.Fatal(err)
	}
	// No waiting: the release happened before the delete returned.
	if g, err := store.GetGrant(ctx, ns, "report"); err != nil || g != nil {
		t.Fatalf("the delete returned and etcd still holds %+v (%v)", g, err)
	}
	if d, err := store.DeletionOf(ctx, ns, "report", string(lease.UID)); err != nil || d == nil {
		t.Fatalf("no deletion recorded for the Lease (%v)", err)
	}
	if err := fx.Client.Get(ctx, client.ObjectKeyFromObject(lease), &fencerv1.Lease{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the Lease after its delete: %v, want NotFound (no finalizer holds it)", err)
	}
	err := write(fx.Client, ns, tok, "after")
	if err == nil {
		t.Fatalf("the old holder wrote under token %d after its Lease was deleted", tok)
	}
	if !apierrors.IsConflict(err) {
		t.Fatalf("the old holder's write after the delete: %v, want fencer's 409", err)
	}

	again := &fencerv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "report", Namespace: ns},
		Spec:       fencerv1.LeaseSpec{TTLSeconds: 2, HolderSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "w"}}},
	}
	if err := fx.Client.Create(ctx, again); err != nil {
		t.Fatal(err)
	}
	_, tok2 := held(t, ns, "")
	if tok2 <= tok {
		t.Fatalf("the Lease created again holds token %d, not above the deleted one's %d", tok2, tok)
	}
	if g, err := store.GetGrant(ctx, ns, "report"); err != nil || g == nil || g.LeaseUID != string(again.UID) {
		t.Fatalf("the new grant %+v (%v) is not recorded for the new Lease %s", g, err, again.UID)
	}
}

// A DELETE fencer admitted may still not happen: another admission check
// refuses it after fencer's webhook released the grant. The Lease then
// says why nobody holds it (Deleting) and is granted again, with a greater
// token, once the controller has seen it is still there past the grace.
// (The admitted-but-failed delete is made here as the webhook makes it:
// ReleaseDeleted for the Lease's UID, with the Lease left in place.)
func TestLeaseWhoseDeleteNeverHappenedIsGrantedAgain(t *testing.T) {
	fx.LeaseDeletionGrace = 3 * time.Second
	t.Cleanup(func() { fx.LeaseDeletionGrace = 0 })
	ns, _, tok := setup(t, nil)
	ctx := context.Background()
	lease := &fencerv1.Lease{}
	if err := fx.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "report"}, lease); err != nil {
		t.Fatal(err)
	}
	store := etcdstore.NewStore(fx.EtcdCli, etcdkeys.DefaultPrefix, nil, nil)
	if _, err := store.ReleaseDeleted(ctx, ns, "report", string(lease.UID), time.Now()); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, 30*time.Second, "the Lease shows its deletion pending", func() error {
		l := &fencerv1.Lease{}
		if err := fx.Client.Get(ctx, client.ObjectKeyFromObject(lease), l); err != nil {
			return err
		}
		if c := heldCondition(l); c == nil || c.Reason != fencerv1.ReasonDeleting || l.Status.Holder != "" {
			return fmt.Errorf("holder %q, Held %+v", l.Status.Holder, c)
		}
		return nil
	})
	_, tok2 := held(t, ns, "")
	if tok2 <= tok {
		t.Fatalf("granted again with token %d, not above %d", tok2, tok)
	}
	if d, err := store.DeletionOf(ctx, ns, "report", string(lease.UID)); err != nil || d != nil {
		t.Fatalf("the deletion record is left: %+v (%v)", d, err)
	}
}

func heldCondition(l *fencerv1.Lease) *metav1.Condition {
	for i := range l.Status.Conditions {
		if l.Status.Conditions[i].Type == fencerv1.ConditionHeld {
			return &l.Status.Conditions[i]
		}
	}
	return nil
}

// A DeleteCollection, which is how the namespace controller deletes a
// namespace's Leases, is admitted object by object with no name in the
// request: the webhook takes the Lease from the object, and the grant is
// released before the collection's delete returns.
func TestLeaseDeleteCollectionReleasesEachGrant(t *testing.T) {
	ns, _, tok := setup(t, nil)
	ctx := context.Background()
	store := etcdstore.NewStore(fx.EtcdCli, etcdkeys.DefaultPrefix, nil, nil)
	lease := &fencerv1.Lease{}
	if err := fx.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "report"}, lease); err != nil {
		t.Fatal(err)
	}
	if err := fx.Client.DeleteAllOf(ctx, &fencerv1.Lease{}, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	if g, err := store.GetGrant(ctx, ns, "report"); err != nil || g != nil {
		t.Fatalf("the collection's delete returned and etcd still holds %+v (%v); token was %d", g, err, tok)
	}
	if d, err := store.DeletionOf(ctx, ns, "report", string(lease.UID)); err != nil || d == nil {
		t.Fatalf("no deletion recorded for lease %s/report (%v)", ns, err)
	}
}

// In a namespace the Lease deletion webhook skips (kube-system here, as
// config/webhook has it), a Lease keeps the finalizer fencer.io/release:
// the controller releases its grant before it lets the Lease go.
func TestLeaseInASkippedNamespaceKeepsTheFinalizer(t *testing.T) {
	ns, _, tok := setupIn(t, "kube-system", nil)
	ctx := context.Background()
	lease := &fencerv1.Lease{}
	if err := fx.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "report"}, lease); err != nil {
		t.Fatal(err)
	}
	if len(lease.Finalizers) != 1 || lease.Finalizers[0] != fencerv1.LeaseFinalizer {
		t.Fatalf("a Lease in %s carries finalizers %v; want %s", ns, lease.Finalizers, fencerv1.LeaseFinalizer)
	}
	if err := fx.Client.Delete(ctx, lease); err != nil {
		t.Fatal(err)
	}
	store := etcdstore.NewStore(fx.EtcdCli, etcdkeys.DefaultPrefix, nil, nil)
	framework.Eventually(t, 30*time.Second, "the Lease gone", func() error {
		err := fx.Client.Get(ctx, client.ObjectKeyFromObject(lease), &fencerv1.Lease{})
		switch {
		case err == nil:
			return fmt.Errorf("the Lease is still there")
		case !apierrors.IsNotFound(err):
			return err
		}
		// Gone: its grant must have been released before.
		if g, err := store.GetGrant(ctx, ns, "report"); err != nil || g != nil {
			t.Fatalf("the Lease is gone and etcd holds %+v (%v); its first token was %d", g, err, tok)
		}
		return nil
	})
}
