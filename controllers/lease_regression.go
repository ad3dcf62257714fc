package controllers

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/internal/etcdstore"
	"github.com/fencer-io/fencer/internal/metrics"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
)

// revisionRegressed guards against reissuing tokens: a token is an etcd
// revision, so an etcd restored from an old snapshot (without
// --bump-revision) or replaced by an empty cluster would hand out again
// tokens this Lease already gave to earlier holders, and their stale writes
// would pass. The Lease's status, kept by the apiserver, remembers the highest
// token issued; while etcd's revision (at the read that found no grant) is
// below it, nothing is granted.
func (r *LeaseReconciler) revisionRegressed(lease *fencerv1.Lease, rev int64, out *outcome) bool {
	floor, regressed := belowIssued(lease, rev)
	if !regressed {
		return false
	}
	msg := fmt.Sprintf("etcd's revision %d is below token %d this Lease already issued: etcd was restored from an old snapshot or replaced; "+
		"no grant until its revision passes %d (restore with `etcdutl snapshot restore --bump-revision`, see docs/operations.md)", rev, floor, floor)
	showRegressed(lease, msg, out)
	return true
}

// showRegressed says that etcd went back in time and no grant is made:
// Held False, a Warning Event, a count in
// fencer_etcd_revision_regressions_total, and another look in 10 s, when
// etcd's revision may have passed.
func showRegressed(lease *fencerv1.Lease, msg string, out *outcome) {
	metrics.RevisionRegressions.Inc()
	setHeld(lease, metav1.ConditionFalse, fencerv1.ReasonEtcdRevisionRegressed, msg)
	out.event(corev1.EventTypeWarning, fencerv1.ReasonEtcdRevisionRegressed, "%s", msg)
	out.result.RequeueAfter = 10 * time.Second
}

// belowFloor says why a grant was refused at etcd's lock floor: the
// manager found etcd's revision below one it had recorded outside etcd, so
// it grants no Lease, this one included even if its status remembers no
// token (a Lease created since, a WorkloadLease's member re-created), and
// no keyed lock, until etcd's revision passes it.
func belowFloor(lease *fencerv1.Lease, err error, out *outcome) {
	msg := fmt.Sprintf("%v; no Lease or keyed lock is granted until etcd's revision passes it, since every token issued now may have been issued before "+
		"(restore with `etcdutl snapshot restore --bump-revision`, see docs/operations.md)", err)
	showRegressed(lease, msg, out)
}

// dropRegressed refuses a grant whose token is below one this Lease already
// issued: it is never renewed or published, and is deleted with the
// conditional release (only that grant). New grants then wait in
// revisionRegressed until etcd's revision passes the highest token.
func (r *LeaseReconciler) dropRegressed(ctx context.Context, lease *fencerv1.Lease, g *etcdstore.Grant, out *outcome) error {
	floor := lease.Status.HighestToken()
	msg := fmt.Sprintf("etcd holds a grant to %s with token %d, below token %d this Lease already issued: etcd was restored from an old snapshot; "+
		"the grant is refused and deleted, and nothing is granted until etcd's revision passes %d (restore with `etcdutl snapshot restore --bump-revision`, see docs/operations.md)",
		g.Holder, g.Token, floor, floor)
	showRegressed(lease, msg, out)
	if err := r.endGrant(ctx, lease, g); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "deleting a regressed grant", "token", g.Token)
		return nil
	}
	r.mem.dropped(etcdkeys.LeaseKey(r.Store.Prefix(), lease.Namespace, lease.Name))
	return nil
}

// dropUnissued deletes a lease key the controller did not create (its grant
// marker does not match): someone with write access to it, such as a Direct
// Lease's namespace identity, re-created it. Its token was never issued, so
// it is never adopted or published; the next reconcile grants anew.
func (r *LeaseReconciler) dropUnissued(ctx context.Context, lease *fencerv1.Lease, g *etcdstore.Grant, out *outcome) error {
	out.event(corev1.EventTypeWarning, fencerv1.ReasonUnissuedGrant,
		"the lease key holds token %d, which fencer never issued (the key was re-created by something with write access to it, such as a Direct Lease's namespace etcd identity); it is deleted and the Lease granted anew", g.Token)
	ctrl.LoggerFrom(ctx).Info("deleting a lease key fencer did not create", "token", g.Token)
	out.result.RequeueAfter = time.Millisecond
	// The grant the status shows is over too: revoke its etcd lease, so
	// that the key's disappearance does not read as its holder's release.
	if id := clientv3.LeaseID(lease.Status.LeaseID); id != 0 && id != g.LeaseID {
		r.Store.Revoke(id)
	}
	if err := r.endGrant(ctx, lease, g); err != nil {
		return err
	}
	r.mem.dropped(etcdkeys.LeaseKey(r.Store.Prefix(), lease.Namespace, lease.Name))
	return nil
}

// belowIssued reports whether rev (etcd's revision, or a grant's token) is
// below floor, the highest token the Lease's status records.
func belowIssued(lease *fencerv1.Lease, rev int64) (floor int64, below bool) {
	floor = lease.Status.HighestToken()
	return floor, rev < floor
}
