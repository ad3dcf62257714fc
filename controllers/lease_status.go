package controllers

import (
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/internal/etcdstore"
)

// microTime is t as the apiserver stores it: to the microsecond. A status
// set to the nanosecond never equals the one read back from the cache, so
// every reconcile of a held Lease would write its status again.
func microTime(t time.Time) *metav1.MicroTime {
	m := metav1.NewMicroTime(t.Truncate(time.Microsecond))
	return &m
}

func setHeld(l *fencerv1.Lease, status metav1.ConditionStatus, reason, message string) {
	meta.SetStatusCondition(&l.Status.Conditions, metav1.Condition{
		Type: fencerv1.ConditionHeld, Status: status, Reason: reason, Message: message,
		ObservedGeneration: l.Generation,
	})
	// Ready follows Held: a suspended Lease held by no one is as asked.
	ready := status
	if reason == fencerv1.ReasonSuspended {
		ready = metav1.ConditionTrue
	}
	meta.SetStatusCondition(&l.Status.Conditions, metav1.Condition{
		Type: fencerv1.ConditionReady, Status: ready, Reason: reason, Message: message,
		ObservedGeneration: l.Generation,
	})
}

// showGrant puts a live grant's identity in the status.
func showGrant(l *fencerv1.Lease, g *etcdstore.Grant) {
	l.Status.Holder = g.Holder
	l.Status.HolderUID = types.UID(g.HolderUID)
	l.Status.Token = g.Token
	l.Status.LeaseID = int64(g.LeaseID)
	l.Status.AcquireTime = microTime(g.GrantTime)
}

// clearHolder empties the status fields of the current grant; history keeps it.
func clearHolder(l *fencerv1.Lease) {
	l.Status.Holder, l.Status.HolderUID = "", ""
	l.Status.Token, l.Status.LeaseID = 0, 0
	l.Status.AcquireTime, l.Status.RenewTime, l.Status.ExpireTime = nil, nil, nil
}

// lastTenure is the newest tenure in the history, ended or not.
func lastTenure(l *fencerv1.Lease) *fencerv1.Tenure {
	if len(l.Status.History) == 0 {
		return nil
	}
	return &l.Status.History[0]
}

// openTenure is the newest tenure if it has not ended.
func openTenure(l *fencerv1.Lease) *fencerv1.Tenure {
	if t := lastTenure(l); t != nil && t.End == nil {
		return t
	}
	return nil
}

func closeTenure(l *fencerv1.Lease, at time.Time, why fencerv1.TenureEndReason) {
	if t := openTenure(l); t != nil {
		t.End = microTime(at)
		t.EndReason = why
	}
}

// recordMissedGrant puts a live grant that the history does not have at its
// head: its status was never written (the manager crashed after the grant,
// or lost its term, or its status write conflicted). The open tenure before
// it ended by the time this grant began, for the reason known(token) gives
// when this replica ended it, and otherwise for a reason no longer known:
// its endReason stays unset. It reports whether the history changed.
func recordMissedGrant(l *fencerv1.Lease, g *etcdstore.Grant, known func(token int64) (fencerv1.TenureEndReason, bool)) bool {
	if t := lastTenure(l); t != nil && t.Token == g.Token {
		return false
	}
	if t := openTenure(l); t != nil {
		t.End = microTime(g.GrantTime)
		if why, ok := known(t.Token); ok {
			t.EndReason = why
		}
	}
	beginTenure(l, g, g.GrantTime)
	return true
}

// beginTenure puts g's tenure, from start, at the head of the history and
// counts a change of holder. It returns the transition, as the grants
// metric labels it: like coordination.k8s.io Leases, the first holder is no
// transition.
func beginTenure(l *fencerv1.Lease, g *etcdstore.Grant, start time.Time) (transition string) {
	transition = "first"
	if prev := lastTenure(l); prev != nil {
		transition = "same"
		if prev.Holder != g.Holder || prev.HolderUID != types.UID(g.HolderUID) {
			transition = "new"
			l.Status.Transitions++
		}
	}
	pushTenure(l, fencerv1.Tenure{Holder: g.Holder, HolderUID: types.UID(g.HolderUID), Token: g.Token, Start: *microTime(start)})
	return transition
}

// pushTenure prepends t, keeping at most MaxLeaseHistory entries.
func pushTenure(l *fencerv1.Lease, t fencerv1.Tenure) {
	l.Status.History = append([]fencerv1.Tenure{t}, l.Status.History...)
	if len(l.Status.History) > fencerv1.MaxLeaseHistory {
		l.Status.History = l.Status.History[:fencerv1.MaxLeaseHistory]
	}
}

// heldMessage is the Held condition's message for a live grant. A new grant
// and a later reconcile of the same grant give the same message, so the
// reconcile that follows every grant (its holder's annotation coming back
// through the pod watch) finds nothing to write.
func heldMessage(l *fencerv1.Lease, g *etcdstore.Grant) string {
	if l.Spec.Renewal == fencerv1.RenewalDirect {
		return fmt.Sprintf("held by %s with token %d; the holder renews etcd lease %d itself (renewal: Direct)", g.Holder, g.Token, g.LeaseID)
	}
	return fmt.Sprintf("held by %s with token %d", g.Holder, g.Token)
}

// showRenewal shows the controller's last renewal (last) in renewTime and
// expireTime when the Lease's periodic refresh is due (refreshInterval), or
// when what is shown is no renewal of this grant: none yet, or one from
// before acquireTime (a new grant whose first status write failed).
// Renewals happen every TTL/3; showing each would cost a status write per
// Lease per reconcile, and every grant is followed by reconciles its own
// writes cause.
func showRenewal(l *fencerv1.Lease, last time.Time, ttl time.Duration, due bool) {
	if due || l.Status.RenewTime == nil || (l.Status.AcquireTime != nil && l.Status.RenewTime.Before(l.Status.AcquireTime)) {
		l.Status.RenewTime = microTime(last)
	}
	l.Status.ExpireTime = microTime(l.Status.RenewTime.Add(ttl))
}
