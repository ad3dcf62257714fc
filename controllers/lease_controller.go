package controllers

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/internal/etcdstore"
	"github.com/fencer-io/fencer/internal/renew"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
)

// LeaseReconciler grants Leases in etcd, renews PodReady grants, and
// publishes tokens on holder pods.
type LeaseReconciler struct {
	client.Client
	Store    *etcdstore.Store
	Elector  *etcdstore.Elector
	Renewer  *renew.Renewer
	Recorder events.EventRecorder
	Clock    clock.Clock
	// APIReader confirms, uncached, that a Lease the cache does not have
	// is gone before its grant is released (gone).
	APIReader client.Reader
	// Finalize tells the namespaces whose Leases get the finalizer
	// fencer.io/release (FinalizeIn); nil gives it to every Lease.
	Finalize func(namespace string) bool
	// DeletionGrace is how long a Lease whose DELETE fencer's webhook
	// admitted is held ungranted before the controller checks that the
	// delete happened (0 means DefaultDeletionGrace).
	DeletionGrace time.Duration
	// Workers is how many Leases are reconciled at once (0 means 1). The
	// workqueue never hands one Lease to two workers; mem, the store and the
	// renewer are safe for concurrent use.
	Workers int

	// wake carries Leases to reconcile from outside the informers: etcd
	// watch events, lost keepalives and a new election term.
	wake waker[fencerv1.Lease, *fencerv1.Lease]

	// mem is what the reconciler remembers of each Lease between
	// reconciles.
	mem *leaseMemory
	// stale tells a copy of a Lease the cache may be behind on.
	stale staleCopies
}

// NewLeaseReconciler wires a reconciler; the Renewer's lost callback wakes it.
func NewLeaseReconciler(c client.Client, store *etcdstore.Store, elector *etcdstore.Elector, rec events.EventRecorder, clk clock.Clock) *LeaseReconciler {
	r := &LeaseReconciler{
		Client: c, Store: store, Elector: elector, Recorder: rec, Clock: clk,
		wake: newWaker[fencerv1.Lease](),
		mem:  newLeaseMemory(),
	}
	r.Renewer = renewerWaking(store, clk, r.wake, func(key string) (string, string, bool) {
		return etcdkeys.ParseLeaseKey(store.Prefix(), key)
	})
	return r
}

// +kubebuilder:rbac:groups=fencer.io,resources=leases,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=fencer.io,resources=leases/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=fencer.io,resources=leases/finalizers,verbs=update
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;patch

// Reconcile grants, renews or releases one Lease and writes its status once.
func (r *LeaseReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	log := ctrl.LoggerFrom(ctx).WithValues("lease", req.NamespacedName)
	ctx = ctrl.LoggerInto(ctx, log)
	res, err := r.reconcile(ctx, req)
	return retryWhenPodCopyBehind(ctx, res, err)
}

// reconcile is Reconcile's pass: the Lease's, or the release of a Lease
// gone or going.
func (r *LeaseReconciler) reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	lease := &fencerv1.Lease{}
	if err := r.Get(ctx, req.NamespacedName, lease); err != nil {
		if apierrors.IsNotFound(err) {
			return r.gone(ctx, req.NamespacedName)
		}
		return ctrl.Result{}, err
	}
	return runPass(ctx, apiClientOf(r.Client, r.APIReader), r.Recorder, lease, r.finalizerFor(lease.Namespace),
		func(ctx context.Context) (ctrl.Result, error) { return r.finalize(ctx, lease) },
		func(ctx context.Context) (outcome, error) { return r.reconcileGrant(ctx, lease) })
}

// reconcileGrant brings etcd and the pods in line with the Lease's spec and
// sets lease.Status to match. It returns an error only for failures the
// workqueue should retry with backoff.
//
// A pass reads the candidates and the grant, then either keeps or ends the
// live grant (keepOrEnd, lease_tenure.go) or closes a tenure that lapsed
// (closeLapsed), and, with no grant left live, grants the next holder
// (grantNext, lease_grant.go). The status is set along the way in
// lease_status.go, and the pods are annotated once it is written.
func (r *LeaseReconciler) reconcileGrant(ctx context.Context, lease *fencerv1.Lease) (outcome, error) {
	var out outcome
	now := r.Clock.Now()
	lease.Status.ObservedGeneration = lease.Generation

	pods, err := r.candidates(ctx, lease)
	if err != nil {
		return out, err
	}
	// Read first: reads need no leadership, and a failed read is how an
	// etcd outage shows, even after it has also cost us the election.
	grant, rev, err := r.Store.ReadGrant(ctx, lease.Namespace, lease.Name)
	if err != nil {
		r.etcdUnavailable(lease, &out, err)
		return out, nil
	}
	if _, err := r.Elector.Term(); err != nil {
		// Not leading etcd (yet): the next term wakes every Lease.
		out.result.RequeueAfter = time.Second
		return out, nil
	}

	if grant != nil && (grant.Unissued || (grant.LeaseUID != "" && grant.LeaseUID != string(lease.UID)) || grant.Token < lease.Status.HighestToken()) {
		// A grant this Lease does not keep: the pass releases it.
		if r.cacheBehind(ctx, lease, &out) {
			return out, nil
		}
	}
	switch {
	case grant != nil && grant.Unissued:
		return out, r.dropUnissued(ctx, lease, grant, &out)
	case grant != nil && grant.LeaseUID != "" && grant.LeaseUID != string(lease.UID):
		return out, r.dropPredecessorGrant(ctx, lease, grant, &out)
	case grant != nil && grant.Token < lease.Status.HighestToken():
		// A grant below a token already issued came back with an etcd
		// restored from an old snapshot: adopting it would reissue a token.
		return out, r.dropRegressed(ctx, lease, grant, &out)
	case grant != nil:
		ended, err := r.keepOrEnd(ctx, lease, grant, pods, now, &out)
		if err != nil {
			r.etcdUnavailable(lease, &out, err)
			return out, nil
		}
		if !ended {
			r.publishAfterStatus(&out, lease, pods, grant, rev)
			return out, nil
		}
	default:
		// closeLapsed records why a tenure ended, and revokes what the
		// holder may still renew: not on an older copy's account.
		if lease.Status.OpenTenure() != nil && r.cacheBehind(ctx, lease, &out) {
			return out, nil
		}
		if err := r.closeLapsed(ctx, lease, pods, now, &out); err != nil {
			r.etcdUnavailable(lease, &out, err)
			return out, nil
		}
	}

	grant, err = r.grantNext(ctx, lease, pods, rev, now, &out)
	if err != nil {
		r.etcdUnavailable(lease, &out, err)
		return out, nil
	}
	r.publishAfterStatus(&out, lease, pods, grant, rev)
	return out, nil
}

// cacheBehind, asked before a pass grants or releases, reports whether
// the cache's copy of lease may be older than the API's (staleCopies), and
// then sets out to wait for the cache. A grant or a release decided on an
// older spec than the last leader acted on could undo its work: grant the
// Lease back to the pod its selector no longer names, or end a holder's
// tenure for a suspension since lifted. Keeping a live grant needs no such
// look: a new leader adopts every grant at once, whatever its cache shows.
// A failed look waits too, and says why.
func (r *LeaseReconciler) cacheBehind(ctx context.Context, lease *fencerv1.Lease, out *outcome) bool {
	behind, err := r.stale.behindInTerm(ctx, r.Elector, r.APIReader, &fencerv1.LeaseList{}, lease)
	if err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "reading the Lease from the apiserver, to tell whether the cache is behind")
	}
	if behind || err != nil {
		*out = waitForCache()
		return true
	}
	return false
}

// candidates lists the pods the Lease's selector matches. A selector that
// cannot be parsed matches no pod (noCandidates says why), so its holder
// loses the tenure and its annotations go, as for any unselected holder.
func (r *LeaseReconciler) candidates(ctx context.Context, lease *fencerv1.Lease) ([]corev1.Pod, error) {
	sel, err := metav1.LabelSelectorAsSelector(&lease.Spec.HolderSelector)
	if err != nil {
		return nil, nil
	}
	return podsMatching(ctx, r.Client, lease.Namespace, &lease.Spec.HolderSelector, sel)
}

func (r *LeaseReconciler) etcdUnavailable(lease *fencerv1.Lease, out *outcome, err error) {
	reason, msg := etcdFailure(err)
	setHeld(lease, metav1.ConditionUnknown, reason, msg)
	out.event(corev1.EventTypeWarning, reason, "%s", msg)
	out.result.RequeueAfter = 2 * time.Second
	ctrl.Log.V(1).Info("etcd unavailable", "lease", client.ObjectKeyFromObject(lease), "err", err.Error())
}
