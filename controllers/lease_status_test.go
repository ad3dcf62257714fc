package controllers

import (
	"testing"
	"time"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/internal/etcdstore"
)

// A grant whose status was never written (the manager crashed after it) is
// put into the history when a later reconcile finds it in etcd: without it,
// the status named the new holder over a history whose head was the old
// tenure, still open, and the highest token it recorded was the old one.
func TestRecordMissedGrant(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	grantB := &etcdstore.Grant{Token: 20}
	grantB.Holder, grantB.HolderUID, grantB.GrantTime = "b", "uid-b", t0.Add(time.Minute)

	t.Run("old tenure open", func(t *testing.T) {
		l := &fencerv1.Lease{}
		l.Status.Holder, l.Status.Token = "a", 10
		pushTenure(l, fencerv1.Tenure{Holder: "a", HolderUID: "uid-a", Token: 10, Start: *microTime(t0)})
		if !recordMissedGrant(l, grantB, unknown) {
			t.Fatal("the missed grant was not recorded")
		}
		h := l.Status.History
		if len(h) != 2 || h[0].Token != 20 || h[0].Holder != "b" || h[0].End != nil || !h[0].Start.Time.Equal(grantB.GrantTime) {
			t.Fatalf("history head %+v, want b's open tenure with token 20 from the grant time", h)
		}
		if h[1].End == nil || !h[1].End.Time.Equal(grantB.GrantTime) || h[1].EndReason != "" {
			t.Errorf("a's tenure %+v: want it ended at b's grant, its reason unknown", h[1])
		}
		if l.Status.Transitions != 1 {
			t.Errorf("transitions %d, want 1", l.Status.Transitions)
		}
		clearHolder(l) // b's tenure ends later: the history must still know 20
		if got := l.Status.HighestToken(); got != 20 {
			t.Errorf("highest token %d, want 20", got)
		}
	})
	t.Run("no history", func(t *testing.T) {
		l := &fencerv1.Lease{}
		if !recordMissedGrant(l, grantB, unknown) || len(l.Status.History) != 1 || l.Status.Transitions != 0 {
			t.Fatalf("first grant: history %+v, transitions %d", l.Status.History, l.Status.Transitions)
		}
	})
	t.Run("already recorded", func(t *testing.T) {
		l := &fencerv1.Lease{}
		pushTenure(l, fencerv1.Tenure{Holder: "b", HolderUID: "uid-b", Token: 20, Start: *microTime(grantB.GrantTime)})
		if recordMissedGrant(l, grantB, unknown) || len(l.Status.History) != 1 {
			t.Fatalf("a recorded grant changed the history: %+v", l.Status.History)
		}
	})
}

func unknown(int64) (fencerv1.TenureEndReason, bool) { return "", false }

// A tenure this replica ended, whose status write then conflicted, keeps
// its reason when the next pass records the grant that followed it.
func TestRecordMissedGrantKeepsAKnownReason(t *testing.T) {
	l := &fencerv1.Lease{}
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	first := &etcdstore.Grant{Token: 10}
	first.Holder, first.HolderUID = "a", "ua"
	beginTenure(l, first, now)
	next := &etcdstore.Grant{Token: 20}
	next.Holder, next.HolderUID, next.GrantTime = "b", "ub", now.Add(time.Second)
	known := func(token int64) (fencerv1.TenureEndReason, bool) { return fencerv1.TenureHolderGone, token == 10 }
	if !recordMissedGrant(l, next, known) {
		t.Fatal("the grant was not recorded")
	}
	if h := l.Status.History; len(h) != 2 || h[1].Token != 10 || h[1].EndReason != fencerv1.TenureHolderGone || h[1].End == nil {
		t.Fatalf("history %+v, want token 10 ended HolderGone", h)
	}
}

// A grant ended before its status was written is still put in the history
// (its token was issued), then closed, and no holder is left shown.
func TestShowEndedRecordsTheGrantItEnds(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	l := &fencerv1.Lease{}
	a := &etcdstore.Grant{Token: 10}
	a.Holder, a.HolderUID = "a", "ua"
	showNewGrant(l, a, t0)
	b := &etcdstore.Grant{Token: 20}
	b.Holder, b.HolderUID, b.GrantTime = "b", "ub", t0.Add(time.Minute)
	if !showEnded(l, b, unknown, t0.Add(2*time.Minute), fencerv1.TenureHolderNotSelected) {
		t.Fatal("the missed grant was not reported")
	}
	h := l.Status.History
	if len(h) != 2 || h[0].Token != 20 || h[0].End == nil || h[0].EndReason != fencerv1.TenureHolderNotSelected {
		t.Fatalf("history %+v, want token 20 ended HolderNotSelected", h)
	}
	if l.Status.Holder != "" || l.Status.Token != 0 || l.Status.AcquireTime != nil || l.Status.HighestToken() != 20 {
		t.Errorf("status %+v still shows a holder, or lost token 20", l.Status)
	}
	if showEnded(l, nil, nil, t0.Add(3*time.Minute), fencerv1.TenureExpired) || h[0].EndReason != fencerv1.TenureHolderNotSelected {
		t.Errorf("an ended tenure was closed again: %+v", h[0])
	}
}
