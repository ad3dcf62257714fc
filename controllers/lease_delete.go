package controllers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/internal/etcdstore"
	"github.com/fencer-io/fencer/internal/metrics"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
)

// finalizerFor is the finalizer a Lease in namespace gets:
// fencer.io/release, so that a Lease is never gone while its grant lives,
// unless the opt-in Lease deletion webhook releases the grant as it admits
// the Lease's DELETE (and then still in the namespaces that webhook skips).
// The webhook lease-finalizer.fencer.io sets it as the Lease is created,
// so the controller writes it only where that webhook did not answer.
func (r *LeaseReconciler) finalizerFor(namespace string) string {
	if r.Finalize == nil || r.Finalize(namespace) {
		return fencerv1.LeaseFinalizer
	}
	return ""
}

// FinalizeIn is a LeaseReconciler's Finalize, and the Lease finalizer
// webhook's: the namespaces listed, or all.
func FinalizeIn(namespaces []string, everywhere bool) func(string) bool {
	set := map[string]bool{}
	for _, ns := range namespaces {
		set[ns] = true
	}
	return func(ns string) bool { return everywhere || set[ns] }
}

// DefaultDeletionGrace is how long after fencer's webhook admitted a
// Lease's DELETE the controller waits before it concludes, if the
// apiserver still has the Lease and is not deleting it, that the delete
// never happened, and grants the Lease again. It is twice the apiserver's
// default request timeout (60 s), which bounds a DELETE from its
// admission to its commit, measured by etcd (the age of the deletion
// record's etcd lease), not by comparing two replicas' clocks.
const DefaultDeletionGrace = 2 * time.Minute

// finalize releases the grant and the pod annotations of a Lease being
// deleted (its deletionTimestamp is set), then removes fencer's finalizer
// if it carries it. Without the finalizer (the opt-in Lease deletion
// webhook released the grant as it admitted the DELETE) this still covers
// a Lease whose deletion waits on other finalizers or on its dependents.
func (r *LeaseReconciler) finalize(ctx context.Context, lease *fencerv1.Lease) (ctrl.Result, error) {
	if res, err := r.releaseAll(ctx, client.ObjectKeyFromObject(lease), lease.UID); err != nil || !res.IsZero() {
		return res, err
	}
	return r.afterRelease(ctx, lease)
}

// afterRelease shows the grant released, when the Lease outlives the
// release, or else drops fencer's finalizer. Never both in one pass: a
// status write retried onto a fresher copy of the Lease (writeStatus) makes
// this pass's copy look current, and an update of it would undo whatever
// else changed meanwhile (a label, an annotation). The status write wakes
// the next pass, which drops the finalizer from the Lease as it is then.
func (r *LeaseReconciler) afterRelease(ctx context.Context, lease *fencerv1.Lease) (ctrl.Result, error) {
	c := apiClientOf(r.Client, r.APIReader)
	wrote, err := r.showReleasedAtDeletion(ctx, lease)
	switch {
	case err != nil:
		return c.requeueIfStale(ctx, lease, err)
	case wrote:
		return ctrl.Result{RequeueAfter: cacheCatchUp}, nil
	}
	return dropFinalizer(ctx, c, lease, fencerv1.LeaseFinalizer)
}

// showReleasedAtDeletion writes that the grant of a Lease being deleted is
// released, when the deletion waits on a finalizer other than fencer's (a
// tool's, or foregroundDeletion's dependents). The Lease then outlives the
// release, and a pod reading its status (tokenDelivery: LeaseStatus,
// fence.LeaseSource, fence.StatusHeld) would go on seeing a holder and a
// token that etcd no longer has, for as long as the deletion waits. A Lease
// whose only finalizer is fencer's is gone at the next write: no status
// write for it.
func (r *LeaseReconciler) showReleasedAtDeletion(ctx context.Context, lease *fencerv1.Lease) (wrote bool, err error) {
	waits := slices.ContainsFunc(lease.Finalizers, func(f string) bool { return f != fencerv1.LeaseFinalizer })
	if !waits || (lease.Status.Holder == "" && lease.Status.Token == 0 && lease.Status.OpenTenure() == nil) {
		return false, nil
	}
	before := lease.Status.DeepCopy()
	showEnded(lease, nil, nil, r.Clock.Now(), fencerv1.TenureDeleted)
	setHeld(lease, metav1.ConditionFalse, fencerv1.ReasonDeleting, fmt.Sprintf(
		"the Lease is being deleted and its grant is released; its deletion waits on the finalizers %s", finalizerList(lease.Finalizers)))
	return true, writeStatus(ctx, r.Client, lease, before)
}

// finalizerList names at most five finalizers: a condition message is
// bounded, and a Lease may carry any number.
func finalizerList(fs []string) string {
	if len(fs) <= 5 {
		return fmt.Sprint(fs)
	}
	return fmt.Sprintf("%v and %d more", fs[:5], len(fs)-5)
}

// deletionPending is grantNext's answer when etcd refused the grant because
// fencer's webhook admitted a DELETE of this Lease object (its deletion
// record, etcdstore.ReleaseDeleted) and the cache still shows it: nothing
// is granted while the deletion is pending. A DELETE fencer admitted may
// still not happen (another webhook or policy refused it); so once the
// record is DeletionGrace old and the apiserver still has this Lease, not
// being deleted, the record is lifted and the Lease is granted again.
func (r *LeaseReconciler) deletionPending(ctx context.Context, lease *fencerv1.Lease, out *outcome) error {
	d, err := r.Store.DeletionOf(ctx, lease.Namespace, lease.Name, string(lease.UID))
	if err != nil {
		return err
	}
	if d == nil { // the record expired or was lifted since the grant
		out.result.RequeueAfter = time.Millisecond
		return nil
	}
	setHeld(lease, metav1.ConditionFalse, fencerv1.ReasonDeleting, fmt.Sprintf(
		"a DELETE of this Lease was admitted at %s and its grant released; nothing is granted while the deletion is pending",
		d.At.UTC().Format(time.RFC3339)))
	if wait := r.deletionGrace() - d.Age; wait > 0 {
		out.result.RequeueAfter = wait
		return nil
	}
	if there, err := r.notBeingDeleted(ctx, lease); err != nil || !there {
		out.result.RequeueAfter = time.Second // gone or going: the cache will show it
		return err
	}
	if err := r.Store.ForgetDeletion(ctx, d); err != nil {
		if errors.Is(err, etcdstore.ErrDeletionChanged) {
			out.result.RequeueAfter = time.Millisecond // deleted again meanwhile: look again
			return nil
		}
		return err
	}
	out.event(corev1.EventTypeWarning, fencerv1.ReasonDeleting,
		"the DELETE admitted at %s never happened (the Lease is still here, not being deleted): it is granted again", d.At.UTC().Format(time.RFC3339))
	out.result.RequeueAfter = time.Millisecond
	return nil
}

func (r *LeaseReconciler) deletionGrace() time.Duration {
	if r.DeletionGrace > 0 {
		return r.DeletionGrace
	}
	return DefaultDeletionGrace
}

// isCurrent asks the apiserver, not the cache, whether the Lease of name
// is the object uid.
func (r *LeaseReconciler) isCurrent(ctx context.Context, name types.NamespacedName, uid types.UID) (bool, error) {
	now, err := r.leaseNow(ctx, name)
	return now != nil && now.UID == uid, err
}

// notBeingDeleted asks the apiserver, not the cache, whether this very
// Lease object (its UID) is still there with no deletionTimestamp.
func (r *LeaseReconciler) notBeingDeleted(ctx context.Context, lease *fencerv1.Lease) (bool, error) {
	now, err := r.leaseNow(ctx, client.ObjectKeyFromObject(lease))
	return now != nil && now.UID == lease.UID && now.DeletionTimestamp.IsZero(), err
}

// leaseNow is the Lease of name as the apiserver has it: nil when there is
// none.
func (r *LeaseReconciler) leaseNow(ctx context.Context, name types.NamespacedName) (*fencerv1.Lease, error) {
	now := &fencerv1.Lease{}
	switch err := r.uncached().Get(ctx, name, now); {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, err
	}
	return now, nil
}

// dropPredecessorGrant releases a grant that etcd holds for an earlier
// Lease object of the same name: one deleted without fencer releasing it
// (no webhook was there to admit its DELETE, and no controller saw it go
// before the new one came, as with kubectl replace --force). The new Lease
// never takes it on; the next pass grants it anew, with a greater token.
//
// The apiserver, not the cache, first confirms that this Lease object is
// the one of the name: a cache behind it (a new leader's) may still show
// a Lease deleted since, and the grant then belongs to its successor.
func (r *LeaseReconciler) dropPredecessorGrant(ctx context.Context, lease *fencerv1.Lease, g *etcdstore.Grant, out *outcome) error {
	current, err := r.notBeingDeleted(ctx, lease)
	if err != nil {
		return err
	}
	if !current {
		out.result.RequeueAfter = cacheCatchUp
		return nil
	}
	out.event(corev1.EventTypeWarning, fencerv1.ReasonPredecessorGrant,
		"etcd held token %d, granted to %s for an earlier Lease of this name (UID %s); it is released, and this Lease granted anew", g.Token, g.Holder, g.LeaseUID)
	ctrl.LoggerFrom(ctx).Info("releasing the grant of an earlier Lease of this name", "token", g.Token, "leaseUID", g.LeaseUID)
	out.result.RequeueAfter = time.Millisecond
	if err := r.endGrant(ctx, lease, g); err != nil {
		return err
	}
	r.mem.dropped(etcdkeys.LeaseKey(r.Store.Prefix(), lease.Namespace, lease.Name))
	return nil
}

// gone releases what a Lease that no longer exists left behind (releaseAll).
// finalize does this for a Lease deleted with fencer's finalizer; a Lease
// whose finalizer was removed by hand (as docs/install.md says to do after
// an uninstall), or deleted while no manager ran, comes here. The cache may
// not have seen a Lease just created, so the apiserver confirms the Lease
// is gone before anything is released.
func (r *LeaseReconciler) gone(ctx context.Context, name types.NamespacedName) (ctrl.Result, error) {
	if r.APIReader != nil {
		err := r.APIReader.Get(ctx, name, &fencerv1.Lease{})
		switch {
		case err == nil:
			return ctrl.Result{RequeueAfter: cacheCatchUp}, nil // the cache has yet to see it
		case !apierrors.IsNotFound(err):
			return ctrl.Result{}, err
		}
	}
	return r.releaseAll(ctx, name, "")
}

// releaseAll ends everything a deleted Lease held: its grant (conditional
// delete and revoke, so its holder's Hold and WatchHeld end), its renewal,
// its grant marker, the annotations of every pod that carries them, and
// what the reconciler remembers of it. A zero Result means all is done.
//
// uid is the deleted Lease object's, when the pass knows it (finalize). A
// grant etcd records for another UID may belong to a Lease created again
// under the name since, which a cache behind the apiserver (a new
// leader's) still shows as the deleted one: when the apiserver has that
// Lease, the grant, its renewal and its holder's annotation are the new
// Lease's, and stay. Any other such grant is a predecessor's (deleted
// without fencer releasing it), and goes with this one. With no uid (gone:
// the apiserver has no Lease of the name), whatever the name holds goes.
func (r *LeaseReconciler) releaseAll(ctx context.Context, name types.NamespacedName, uid types.UID) (ctrl.Result, error) {
	if _, err := r.Elector.Term(); err != nil {
		return ctrl.Result{RequeueAfter: time.Second}, nil
	}
	key := etcdkeys.LeaseKey(r.Store.Prefix(), name.Namespace, name.Name)
	g, err := r.Store.GetGrant(ctx, name.Namespace, name.Name)
	if err != nil {
		return ctrl.Result{}, err
	}
	if g != nil && uid != "" && g.LeaseUID != "" && g.LeaseUID != string(uid) {
		successor, err := r.isCurrent(ctx, name, types.UID(g.LeaseUID))
		if err != nil {
			return ctrl.Result{}, err
		}
		if successor {
			ctrl.LoggerFrom(ctx).V(1).Info("the grant under this name is the Lease's created again since; it stays", "leaseUID", g.LeaseUID, "token", g.Token)
			return ctrl.Result{}, nil
		}
	}
	if g != nil {
		lease := &fencerv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: name.Namespace, Name: name.Name}}
		if err := r.endGrant(ctx, lease, g); err != nil {
			return ctrl.Result{}, err
		}
		metrics.LeaseReleases.WithLabelValues(string(fencerv1.TenureDeleted)).Inc()
		ctrl.LoggerFrom(ctx).Info("released the grant of a deleted Lease", "holder", g.Holder, "token", g.Token)
	}
	r.Renewer.Stop(key)
	if err := r.Store.ForgetLease(ctx, name.Namespace, name.Name); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.unpublish(ctx, name.Namespace, name.Name); err != nil {
		return ctrl.Result{}, err
	}
	r.mem.forget(key)
	return ctrl.Result{}, nil
}
