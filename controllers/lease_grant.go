package controllers

import (
	"context"
	"errors"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/internal/etcdstore"
	"github.com/fencer-io/fencer/internal/holder"
	"github.com/fencer-io/fencer/internal/metrics"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
)

// grantNext grants the Lease, whose key holds no grant, to the next holder
// among the candidates (pods), or says in the status why no one gets it.
// rev is etcd's revision at the read that found the key empty. It returns
// the new grant, or nil; an error is an etcd failure.
func (r *LeaseReconciler) grantNext(ctx context.Context, lease *fencerv1.Lease, pods []corev1.Pod, rev int64, now time.Time, out *outcome) (*etcdstore.Grant, error) {
	key := etcdkeys.LeaseKey(r.Store.Prefix(), lease.Namespace, lease.Name)
	if lease.Spec.Suspend {
		setHeld(lease, metav1.ConditionFalse, fencerv1.ReasonSuspended, "spec.suspend is true: the lease is granted to no one")
		r.mem.noGrant(key, false)
		return nil, nil
	}
	if others := running(pods); lease.Spec.SoleCandidate && len(others) > 1 {
		othersRemain(lease, others)
		r.mem.noGrant(key, true) // a pod's deletion wakes the Lease
		return nil, nil
	}
	next := holder.Pick(pods, passOver(lease)...)
	if next == nil {
		noCandidates(lease, out)
		r.mem.noGrant(key, len(pods) > 0) // none Ready yet: one may soon be
		return nil, nil
	}
	if r.cacheBehind(ctx, lease, out) {
		return nil, nil // a selector the last leader moved since
	}
	// No tenure is open: if etcd went back in time, no pod keeps a token,
	// whatever etcd does.
	if r.revisionRegressed(lease, rev, out) {
		r.mem.noGrant(key, true)
		return nil, nil
	}
	ttl := time.Duration(lease.Spec.TTLSeconds) * time.Second
	g, err := r.Store.GrantLease(ctx, lease.Namespace, lease.Name, string(lease.UID), next.Name, string(next.UID), ttl, now)
	switch {
	case err == nil:
		r.granted(lease, key, g, now, out)
		return g, nil
	case errors.Is(err, etcdstore.ErrHeld):
		out.result.RequeueAfter = time.Millisecond // granted meanwhile; read it again
		err = nil
	case errors.Is(err, etcdstore.ErrNotLeader):
		out.result.RequeueAfter = time.Second
		err = nil
	case errors.Is(err, etcdstore.ErrLeaseDeleted):
		err = r.deletionPending(ctx, lease, out)
	case errors.As(err, new(*etcdstore.RevisionFloorError)):
		belowFloor(lease, err, out)
		err = nil
	}
	r.mem.noGrant(key, true)
	return nil, err
}

// granted records a new grant in the status, history, memory and metrics,
// and starts renewing it when the controller is to renew it.
func (r *LeaseReconciler) granted(lease *fencerv1.Lease, key string, g *etcdstore.Grant, now time.Time, out *outcome) {
	var renewedTTL time.Duration
	if lease.Spec.Renewal == fencerv1.RenewalPodReady {
		r.Renewer.Ensure(key, g.LeaseID, now)
		renewedTTL = time.Duration(g.TTL) * time.Second
	}
	metrics.LeaseGrants.WithLabelValues(showNewGrant(lease, g, now)).Inc()
	deletedAt, failover, refresh := r.mem.granted(key, renewedTTL, now)
	if failover {
		metrics.FailoverSeconds.Observe(r.Clock.Since(deletedAt).Seconds())
	}
	if refresh > 0 {
		out.result.RequeueAfter = refresh
	}
	eventGranted(out, g.Holder)
}

// eventGranted records a grant's Normal Event. Its note names the holder
// and not the token, which the status carries: so a Lease granted to the
// same pod again adds to one Event's count instead of posting another
// (eventkey), while a grant to another pod is an Event of its own.
func eventGranted(out *outcome, holder string) {
	out.event(corev1.EventTypeNormal, fencerv1.ReasonGranted, "granted to %s", holder)
}
