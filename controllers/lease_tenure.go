package controllers

import (
	"context"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/internal/etcdstore"
	"github.com/fencer-io/fencer/internal/metrics"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
)

// keepOrEnd handles a live grant: it keeps renewing a qualifying PodReady
// holder, and ends the tenure (conditional delete) when the Lease is
// suspended, or one TTL after the last renewal of a holder that stopped
// qualifying. It reports whether the tenure ended.
func (r *LeaseReconciler) keepOrEnd(ctx context.Context, lease *fencerv1.Lease, g *etcdstore.Grant, pods []corev1.Pod, now time.Time, out *outcome) (bool, error) {
	key := etcdkeys.LeaseKey(r.Store.Prefix(), lease.Namespace, lease.Name)
	ttl := time.Duration(g.TTL) * time.Second
	pod := findPod(pods, g.Holder, g.HolderUID)
	if recordMissedGrant(lease, g, func(token int64) (fencerv1.TenureEndReason, bool) { return r.mem.endedReason(key, token) }) {
		out.event(corev1.EventTypeNormal, fencerv1.ReasonGranted, "granted to %s with token %d", g.Holder, g.Token)
	}
	showGrant(lease, g)

	switch decideTenure(lease, pod) {
	case endSuspended:
		return true, r.release(ctx, lease, g, fencerv1.TenureSuspended, now, out)
	case endHolderLost:
		why, lagging, err := r.whyLost(ctx, lease, g)
		if err != nil {
			return false, err
		}
		if lagging {
			out.result.RequeueAfter = 100 * time.Millisecond // the cache will catch up
			return false, nil
		}
		return true, r.release(ctx, lease, g, why, now, out)
	case keepDirect:
		// The holder renews through the SDK; etcd expiry ends the tenure.
		r.Renewer.Stop(key) // renewal may have just been switched from PodReady
		setHeld(lease, metav1.ConditionTrue, fencerv1.ReasonGranted, heldMessage(lease, g))
		// Nothing to refresh (no renewTime): a periodic look, taking no slot.
		out.result.RequeueAfter = max(ttl, statusRefresh)
		return false, nil
	case keepRenewing:
		r.mem.clearEnding(key)
		if !r.Renewer.Renewing(key, g.LeaseID) {
			r.Renewer.Ensure(key, g.LeaseID, now) // adopting a grant, e.g. after a controller failover
		}
		last, _ := r.Renewer.LastRenew(key)
		showRenewal(lease, last, ttl, r.mem.refreshDue(key, now))
		setHeld(lease, metav1.ConditionTrue, fencerv1.ReasonGranted, heldMessage(lease, g))
		out.result.RequeueAfter = r.mem.refreshInterval(key, ttl, now)
		return false, nil
	}

	reason := whyNotQualified(pod)
	end, err := r.tenureEnd(ctx, key, g, now)
	if err != nil {
		return false, err
	}
	if now.Before(end) {
		lease.Status.ExpireTime = microTime(end)
		setHeld(lease, metav1.ConditionTrue, fencerv1.ReasonGranted, fmt.Sprintf("held by %s with token %d until %s: the holder no longer qualifies (%s) and is not renewed", g.Holder, g.Token, end.UTC().Format(time.RFC3339Nano), reason))
		out.requeueAt(now, end)
		return false, nil
	}
	return true, r.release(ctx, lease, g, reason, now, out)
}

// tenureEnd is when a grant no longer renewed ends: one TTL after its last
// renewal. Stopping the renewer yields that time; a grant adopted from
// another controller replica has only etcd's remaining TTL to go by.
func (r *LeaseReconciler) tenureEnd(ctx context.Context, key string, g *etcdstore.Grant, now time.Time) (time.Time, error) {
	end, known := r.mem.ending(key)
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
	r.mem.setEnding(key, end)
	return end, nil
}

// whyLost names why a holder missing from the candidates lost its tenure:
// its pod is gone or replaced (another UID under its name), or is still
// there but no longer matches spec.holderSelector.
//
// The pod is read from the apiserver, not the cache: a cache behind it
// (a new leader's, just after a relist) must not end a tenure whose
// holder is still there and selected; then lagging is true.
func (r *LeaseReconciler) whyLost(ctx context.Context, lease *fencerv1.Lease, g *etcdstore.Grant) (why fencerv1.TenureEndReason, lagging bool, err error) {
	reader := client.Reader(r.Client)
	if r.APIReader != nil {
		reader = r.APIReader
	}
	pod := &corev1.Pod{}
	err = reader.Get(ctx, client.ObjectKey{Namespace: lease.Namespace, Name: g.Holder}, pod)
	switch {
	case apierrors.IsNotFound(err):
		return fencerv1.TenureHolderGone, false, nil
	case err != nil:
		return "", false, err
	case string(pod.UID) != g.HolderUID:
		return fencerv1.TenureHolderGone, false, nil
	}
	sel, err := metav1.LabelSelectorAsSelector(&lease.Spec.HolderSelector)
	if err == nil && sel.Matches(labels.Set(pod.Labels)) {
		return "", true, nil
	}
	return fencerv1.TenureHolderNotSelected, false, nil
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

// release ends a tenure with the conditional delete.
func (r *LeaseReconciler) release(ctx context.Context, lease *fencerv1.Lease, g *etcdstore.Grant, why fencerv1.TenureEndReason, now time.Time, out *outcome) error {
	if err := r.endGrant(ctx, lease, g); err != nil {
		return err
	}
	key := etcdkeys.LeaseKey(r.Store.Prefix(), lease.Namespace, lease.Name)
	r.mem.markDeleted(key, r.Clock.Now())
	r.mem.setEnded(key, g.Token, why)
	closeTenure(lease, now, why)
	metrics.LeaseReleases.WithLabelValues(string(why)).Inc()
	out.event(corev1.EventTypeNormal, fencerv1.ReasonReleased, "tenure of %s (token %d) ended: %s", g.Holder, g.Token, why)
	return nil
}

// endGrant stops renewing g and deletes it with the conditional release: a
// newer grant under the key is left alone.
func (r *LeaseReconciler) endGrant(ctx context.Context, lease *fencerv1.Lease, g *etcdstore.Grant) error {
	key := etcdkeys.LeaseKey(r.Store.Prefix(), lease.Namespace, lease.Name)
	r.Renewer.Stop(key)
	r.mem.forgetRefresh(key)
	if err := r.Store.Release(ctx, lease.Namespace, lease.Name, g); err != nil && !errors.Is(err, etcdstore.ErrTokenMismatch) {
		return err
	}
	r.mem.clearEnding(key)
	return nil
}

// granted records a new grant in the status, history and metrics.
func (r *LeaseReconciler) granted(lease *fencerv1.Lease, key string, g *etcdstore.Grant, now time.Time, out *outcome) {
	if lease.Spec.Renewal == fencerv1.RenewalPodReady {
		r.Renewer.Ensure(key, g.LeaseID, now)
	}
	metrics.LeaseGrants.WithLabelValues(beginTenure(lease, g, now)).Inc()
	if at, ok := r.mem.takeDeleted(key); ok {
		metrics.FailoverSeconds.Observe(r.Clock.Since(at).Seconds())
	}
	showGrant(lease, g)
	lease.Status.RenewTime = microTime(now)
	lease.Status.ExpireTime = microTime(now.Add(time.Duration(g.TTL) * time.Second))
	setHeld(lease, metav1.ConditionTrue, fencerv1.ReasonGranted, heldMessage(lease, g))
	out.event(corev1.EventTypeNormal, fencerv1.ReasonGranted, "granted to %s with token %d", g.Holder, g.Token)
}
