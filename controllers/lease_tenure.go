package controllers

import (
	"context"
	"errors"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/internal/etcdstore"
	"github.com/fencer-io/fencer/internal/holder"
	"github.com/fencer-io/fencer/internal/metrics"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
)

// keepOrEnd handles a live grant: it keeps renewing a qualifying PodReady
// holder, and ends the tenure (conditional delete) when the Lease is
// suspended, when the holder's pod is gone or unselected, or one TTL after
// the last renewal of a holder that stopped qualifying. It reports whether
// the tenure ended; the status shows the outcome either way.
func (r *LeaseReconciler) keepOrEnd(ctx context.Context, lease *fencerv1.Lease, g *etcdstore.Grant, pods []corev1.Pod, now time.Time, out *outcome) (bool, error) {
	key := etcdkeys.LeaseKey(r.Store.Prefix(), lease.Namespace, lease.Name)
	known := r.endedHereFor(key)
	missed := false
	defer func() {
		if missed {
			eventGranted(out, g.Holder)
		}
	}()

	action, unqualified := decideHolder(lease, g, pods)
	if (action == endSuspended || action == endHolderLost) && r.cacheBehind(ctx, lease, out) {
		// Until the cache says, the grant is kept as the last leader
		// left it: renewed, if the controller renews it.
		r.keepRenewing(lease, key, g, now)
		return false, nil
	}
	switch action {
	case endSuspended:
		return true, r.release(ctx, lease, g, fencerv1.TenureSuspended, now, out)
	case endHolderLost:
		why, live, err := r.whyLost(ctx, lease, g)
		if err != nil {
			return false, err
		}
		if live != nil {
			// The pod cache is behind the holder (its labels, say): the
			// apiserver shows it there and selected. Kept, and renewed while
			// it qualifies, so that a new leader whose cache lags does not
			// let an adopted grant lapse.
			if holder.Qualifies(live) {
				r.keepRenewing(lease, key, g, now)
			}
			missed = showLive(lease, g, known, "")
			out.result.RequeueAfter = 100 * time.Millisecond // the cache will catch up
			return false, nil
		}
		return true, r.release(ctx, lease, g, why, now, out)
	case keepDirect:
		// The holder renews through the SDK; etcd expiry ends the tenure.
		r.Renewer.Stop(key) // renewal may have just been switched from PodReady
		missed = showLive(lease, g, known, "")
		// Nothing to refresh (no renewTime): a periodic look, taking no slot.
		out.result.RequeueAfter = max(time.Duration(g.TTL)*time.Second, statusRefresh)
		return false, nil
	case keepRenewing:
		if !r.Renewer.Renewing(key, g.LeaseID) {
			r.Renewer.Ensure(key, g.LeaseID, now) // adopting a grant, e.g. after a controller failover
		}
		due, next := r.mem.renewing(key, time.Duration(g.TTL)*time.Second, now)
		last, _ := r.Renewer.LastRenew(key)
		missed = showRenewed(lease, g, known, last, due)
		out.result.RequeueAfter = next
		return false, nil
	}

	end, err := r.tenureEnd(ctx, key, g, now)
	if err != nil {
		return false, err
	}
	if now.Before(end) {
		missed = showEnding(lease, g, known, end, unqualified)
		out.requeueAt(now, end)
		return false, nil
	}
	if r.cacheBehind(ctx, lease, out) {
		return false, nil
	}
	return true, r.release(ctx, lease, g, unqualified, now, out)
}

// closeLapsed records the end of the tenure the status shows, if any, when
// its key is gone without our release: the etcd lease expired. If we had
// stopped renewing it, etcd merely beat our own release to it (its lessor
// may run before our timer), and the cause is ours; a Direct holder may
// have released it itself. A release of ours whose status write was lost
// was counted when it happened.
func (r *LeaseReconciler) closeLapsed(ctx context.Context, lease *fencerv1.Lease, pods []corev1.Pod, now time.Time, out *outcome) error {
	open := lease.Status.OpenTenure()
	if open == nil {
		showEnded(lease, nil, nil, now, "")
		return nil
	}
	key := etcdkeys.LeaseKey(r.Store.Prefix(), lease.Namespace, lease.Name)
	why, endedHere, wasEnding := r.mem.lapsed(key, open.Token)
	// A renewal suspended when the holder stopped qualifying
	// (renewalFollowsPod) may have let etcd expire the lease before this
	// pass could end it: that end is ours too. The grant is gone either
	// way, so nothing of it is renewed any more.
	wasEnding = r.Renewer.Suspended(key) || wasEnding
	r.Renewer.Stop(key)
	switch {
	case endedHere:
		showEnded(lease, nil, nil, now, why)
		return nil
	case wasEnding:
		why = whyNotQualified(findPod(pods, open.Holder, string(open.HolderUID)))
	default:
		released, err := r.releasedByHolder(ctx, lease)
		if err != nil {
			return err
		}
		why = fencerv1.TenureExpired
		if released {
			why = fencerv1.TenureReleased
		}
	}
	holder := open.Holder
	showEnded(lease, nil, nil, now, why)
	if why == fencerv1.TenureReleased {
		metrics.LeaseReleases.WithLabelValues(string(why)).Inc()
		out.event(corev1.EventTypeNormal, fencerv1.ReasonReleased, "%s released its tenure", holder)
		return nil
	}
	metrics.LeaseExpiries.Inc()
	out.event(corev1.EventTypeNormal, fencerv1.ReasonExpired, "tenure of %s expired in etcd (%s)", holder, why)
	return nil
}

// tenureEnd is when a grant no longer renewed ends: one TTL after its last
// renewal. Stopping the renewer yields that time; a grant adopted from
// another controller replica has only etcd's remaining TTL to go by.
func (r *LeaseReconciler) tenureEnd(ctx context.Context, key string, g *etcdstore.Grant, now time.Time) (time.Time, error) {
	end, known := r.mem.ending(key, g.Token)
	if known {
		return end, nil
	}
	last, renewedHere := r.Renewer.Stop(key)
	var remaining time.Duration
	if !renewedHere {
		var err error
		if remaining, err = r.Store.RemainingTTL(ctx, g.LeaseID); err != nil {
			return time.Time{}, err
		}
	}
	end = tenureEndFrom(last, renewedHere, time.Duration(g.TTL)*time.Second, remaining, now)
	r.mem.setEnding(key, g.Token, end)
	return end, nil
}

// whyLost names why a holder missing from the candidates lost its tenure:
// its pod is gone or replaced (another UID under its name), or is still
// there but no longer matches spec.holderSelector.
//
// The pod is read from the apiserver, not the cache: a cache behind it
// (a new leader's, just after a relist) must not end a tenure whose
// holder is still there and selected; then it returns that pod, as the
// apiserver has it.
func (r *LeaseReconciler) whyLost(ctx context.Context, lease *fencerv1.Lease, g *etcdstore.Grant) (why fencerv1.TenureEndReason, live *corev1.Pod, err error) {
	pod := &corev1.Pod{}
	err = r.uncached().Get(ctx, client.ObjectKey{Namespace: lease.Namespace, Name: g.Holder}, pod)
	switch {
	case apierrors.IsNotFound(err):
		return fencerv1.TenureHolderGone, nil, nil
	case err != nil:
		return "", nil, err
	case string(pod.UID) != g.HolderUID, holder.Finished(pod):
		return fencerv1.TenureHolderGone, nil, nil
	}
	sel, err := metav1.LabelSelectorAsSelector(&lease.Spec.HolderSelector)
	if err == nil && sel.Matches(labels.Set(pod.Labels)) {
		return "", pod, nil
	}
	return fencerv1.TenureHolderNotSelected, nil, nil
}

// keepRenewing makes sure a PodReady grant kept on the apiserver's word,
// while the cache is behind, is renewed: adopted by a new leader, it would
// otherwise lapse if the cache stayed behind for a TTL.
func (r *LeaseReconciler) keepRenewing(lease *fencerv1.Lease, key string, g *etcdstore.Grant, now time.Time) {
	if lease.Spec.Renewal == fencerv1.RenewalPodReady && !r.Renewer.Renewing(key, g.LeaseID) {
		r.Renewer.Ensure(key, g.LeaseID, now)
	}
}

// uncached reads from the apiserver itself, where the cache may be behind
// what a decision needs (the manager's client when no APIReader is set, as
// in unit tests).
func (r *LeaseReconciler) uncached() client.Reader {
	return apiClientOf(r.Client, r.APIReader).live
}

// releasedByHolder tells a Direct grant its holder released
// (fence.Release deletes the key, conditional on its token) from one that
// expired: the released grant's etcd lease is still alive. The controller
// revokes it, as nothing is attached to it any more. The lease ID is the
// one the controller's own grant recorded: a key rewritten to point
// elsewhere is no grant (etcdstore.readGrant), so it is never published.
func (r *LeaseReconciler) releasedByHolder(ctx context.Context, lease *fencerv1.Lease) (bool, error) {
	id := clientv3.LeaseID(lease.Status.LeaseID)
	if lease.Spec.Renewal != fencerv1.RenewalDirect || id == 0 {
		return false, nil
	}
	alive, err := r.Store.LeaseAlive(ctx, id)
	if err != nil || !alive {
		return false, err
	}
	r.Store.Revoke(id)
	return true, nil
}

// release ends a tenure with the conditional delete, then shows it ended
// (showEnded) and remembers why (leaseMemory.released).
func (r *LeaseReconciler) release(ctx context.Context, lease *fencerv1.Lease, g *etcdstore.Grant, why fencerv1.TenureEndReason, now time.Time, out *outcome) error {
	if err := r.endGrant(ctx, lease, g); err != nil {
		return err
	}
	key := etcdkeys.LeaseKey(r.Store.Prefix(), lease.Namespace, lease.Name)
	if showEnded(lease, g, r.endedHereFor(key), now, why) {
		eventGranted(out, g.Holder)
	}
	r.mem.released(key, g.Token, why, r.Clock.Now())
	metrics.LeaseReleases.WithLabelValues(string(why)).Inc()
	out.event(corev1.EventTypeNormal, fencerv1.ReasonReleased, "tenure of %s ended: %s", g.Holder, why)
	return nil
}

// endGrant stops renewing g and deletes it with the conditional release: a
// newer grant under the key is left alone. The caller updates the memory.
func (r *LeaseReconciler) endGrant(ctx context.Context, lease *fencerv1.Lease, g *etcdstore.Grant) error {
	r.Renewer.Stop(etcdkeys.LeaseKey(r.Store.Prefix(), lease.Namespace, lease.Name))
	if err := r.Store.Release(ctx, lease.Namespace, lease.Name, g); err != nil && !errors.Is(err, etcdstore.ErrTokenMismatch) {
		return err
	}
	return nil
}

// endedHereFor is endedHere for the Lease under key, from the memory.
func (r *LeaseReconciler) endedHereFor(key string) endedHere {
	return func(token int64) (fencerv1.TenureEndReason, bool) { return r.mem.endedReason(key, token) }
}
