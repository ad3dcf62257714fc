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

// endedHere is why this replica ended the tenure with a token, when it
// did (leaseMemory.endedReason): recordMissedGrant closes with it a tenure
// whose status write was lost.
type endedHere func(token int64) (fencerv1.TenureEndReason, bool)

// showLive shows the live grant g as the current tenure, held as message
// says (heldMessage when empty). It reports whether the history lacked g
// (recordMissedGrant), which is worth an Event.
func showLive(l *fencerv1.Lease, g *etcdstore.Grant, known endedHere, message string) (missed bool) {
	missed = recordMissedGrant(l, g, known)
	showGrant(l, g)
	if message == "" {
		message = heldMessage(l, g)
	}
	setHeld(l, metav1.ConditionTrue, fencerv1.ReasonGranted, message)
	return missed
}

// showRenewed is showLive for a grant the controller renews: its last
// renewal (last) is shown as showRenewal decides.
func showRenewed(l *fencerv1.Lease, g *etcdstore.Grant, known endedHere, last time.Time, due bool) (missed bool) {
	missed = showLive(l, g, known, "")
	showRenewal(l, last, time.Duration(g.TTL)*time.Second, due)
	return missed
}

// showEnding is showLive for a grant no longer renewed, which ends at end
// because its holder stopped qualifying (why).
func showEnding(l *fencerv1.Lease, g *etcdstore.Grant, known endedHere, end time.Time, why fencerv1.TenureEndReason) (missed bool) {
	missed = showLive(l, g, known, fmt.Sprintf("held by %s with token %d until %s: the holder no longer qualifies (%s) and is not renewed",
		g.Holder, g.Token, end.UTC().Format(time.RFC3339Nano), why))
	l.Status.ExpireTime = microTime(end)
	return missed
}

// showEnded shows that no grant is live: the open tenure, if any, ended at
// at for why, and no holder is current. g is the grant just ended, if the
// history may lack it (its grant's status write was lost); nil when the
// key was found empty.
func showEnded(l *fencerv1.Lease, g *etcdstore.Grant, known endedHere, at time.Time, why fencerv1.TenureEndReason) (missed bool) {
	if g != nil {
		missed = recordMissedGrant(l, g, known)
	}
	if t := l.Status.OpenTenure(); t != nil {
		t.End = microTime(at)
		t.EndReason = why
	}
	clearHolder(l)
	return missed
}

// showNewGrant shows g, granted at now, as the current tenure at the head
// of the history. It returns the transition, as the grants metric labels
// it (beginTenure).
func showNewGrant(l *fencerv1.Lease, g *etcdstore.Grant, now time.Time) (transition string) {
	transition = beginTenure(l, g, now)
	showGrant(l, g)
	l.Status.RenewTime = microTime(now)
	l.Status.ExpireTime = microTime(now.Add(time.Duration(g.TTL) * time.Second))
	setHeld(l, metav1.ConditionTrue, fencerv1.ReasonGranted, heldMessage(l, g))
	return transition
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

// recordMissedGrant puts a live grant that the history does not have at its
// head: its status was never written (the manager crashed after the grant,
// or lost its term, or its status write conflicted). The open tenure before
// it ended by the time this grant began, for the reason known(token) gives
// when this replica ended it, and otherwise for a reason no longer known:
// its endReason stays unset. It reports whether the history changed.
func recordMissedGrant(l *fencerv1.Lease, g *etcdstore.Grant, known endedHere) bool {
	if t := l.Status.LastTenure(); t != nil && t.Token == g.Token {
		return false
	}
	if t := l.Status.OpenTenure(); t != nil {
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
	if prev := l.Status.LastTenure(); prev != nil {
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
