package controllers

import (
	"fmt"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
)

// Refreshes get slots of their own, 1/statusRefreshRate apart, at least
// statusRefresh (or the TTL) ahead: a burst of grants is refreshed at the
// capped rate, not all at once. A Lease keeps a slot still ahead, and a
// long TTL delays only its own Lease.
func TestRefreshSlots(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	r := newLeaseMemory()
	gap := time.Second / statusRefreshRate
	for i := range 1000 { // a burst: all at one instant
		key := fmt.Sprintf("l%d", i)
		if got, want := r.refreshInterval(key, 15*time.Second, clk.Now()), statusRefresh+time.Duration(i)*gap; got != want {
			t.Fatalf("refresh %d of a burst in %s, want %s", i, got, want)
		}
		if r.refreshDue(key, clk.Now()) {
			t.Fatalf("refresh %d due before its slot", i)
		}
	}
	// Reconciled again before its slot, a Lease keeps it, and no slot is used.
	clk.Step(10 * time.Second)
	if got := r.refreshInterval("l0", 15*time.Second, clk.Now()); got != statusRefresh-10*time.Second {
		t.Errorf("l0 reconciled again: refresh in %s, want its slot, %s", got, statusRefresh-10*time.Second)
	}
	// At its slot the refresh is due, and the next slot comes after the burst's.
	clk.Step(statusRefresh)
	if !r.refreshDue("l0", clk.Now()) {
		t.Error("l0's refresh is not due at its slot")
	}
	if got, want := r.refreshInterval("l0", 15*time.Second, clk.Now()), 1000*gap-10*time.Second; got != want {
		t.Errorf("l0's next refresh in %s, want after the burst's slots, %s", got, want)
	}

	clk.Step(time.Hour)
	// A long TTL sets its own Lease's floor, not the next one's.
	if got := r.refreshInterval("long", time.Hour, clk.Now()); got != time.Hour {
		t.Errorf("TTL 1h: refresh in %s, want 1h", got)
	}
	if got := r.refreshInterval("short", 15*time.Second, clk.Now()); got != statusRefresh+gap {
		t.Errorf("after a 1h-TTL Lease: refresh in %s, want %s", got, statusRefresh+gap)
	}
	r.forgetRefresh("short")
	if got := r.refreshInterval("short", 15*time.Second, clk.Now()); got != statusRefresh+2*gap {
		t.Errorf("a forgotten slot: refresh in %s, want the next slot, %s", got, statusRefresh+2*gap)
	}
}

// A refresh that comes due within a second of a grant yields to the burst
// once: it takes the next slot, after the burst's, and that slot refreshes
// it even in a burst. A refresh with no grant near is never held back.
func TestRefreshYieldsOnceToABurstOfGrants(t *testing.T) {
	m := newLeaseMemory()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ttl := 15 * time.Second
	gap := time.Second / statusRefreshRate
	m.granted("held", ttl, t0)
	for i := range 100 { // the burst's grants take the slots after held's
		m.granted(fmt.Sprintf("g%d", i), ttl, t0)
	}

	due := t0.Add(statusRefresh)
	m.granted("late", ttl, due.Add(-time.Millisecond)) // the burst goes on
	yielded, next := m.renewing("held", ttl, due)
	if yielded {
		t.Fatal("a refresh came due 1 ms after a grant and did not yield to the burst")
	}
	// held's next slot follows every slot handed out since its first, the
	// last of them late's, a statusRefresh after late's grant.
	if want := statusRefresh - time.Millisecond + gap; next != want {
		t.Fatalf("the yielded refresh is next in %s, want the slot after the burst's, %s", next, want)
	}
	again := due.Add(next)
	m.granted("later", ttl, again.Add(-time.Millisecond))
	if refreshed, _ := m.renewing("held", ttl, again); !refreshed {
		t.Fatal("a refresh that had yielded once yielded again: a burst could hold a status back without end")
	}

	// Refreshed, held may yield again in a later burst; with no grant near,
	// its refresh is due at its slot.
	m.granted("quiet", ttl, t0)
	if due, _ := m.renewing("quiet", ttl, again.Add(statusRefresh+time.Hour)); !due {
		t.Fatal("a refresh with no grant within a second yielded")
	}
}

// An unrenewed tenure's end is remembered until taken or cleared, and a
// deletion keeps its first time until a grant takes it (the failover
// duration) or nothing is coming.
func TestLeaseMemoryEndsAndDeletions(t *testing.T) {
	m := newLeaseMemory()
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if _, ok := m.ending("a", 1); ok {
		t.Fatal("an ending before any was set")
	}
	m.setEnding("a", 1, at)
	if got, ok := m.ending("a", 1); !ok || !got.Equal(at) {
		t.Fatalf("ending %v %v, want %v", got, ok, at)
	}
	if got, ok := m.takeEnding("a", 1); !ok || !got.Equal(at) {
		t.Fatalf("takeEnding %v %v", got, ok)
	}
	if _, ok := m.takeEnding("a", 1); ok {
		t.Fatal("an ending taken twice")
	}
	// Another tenure of the Lease (a grant another replica made while this
	// one had lost its term) is not the one being ended.
	m.setEnding("a", 1, at)
	if _, ok := m.ending("a", 2); ok {
		t.Fatal("an ending set for token 1 is known for token 2")
	}
	if _, ok := m.takeEnding("a", 2); ok {
		t.Fatal("an ending set for token 1 was taken for token 2")
	}
	m.setEnding("b", 1, at)
	m.clearEnding("b")
	if _, ok := m.ending("b", 1); ok {
		t.Fatal("a cleared ending is still there")
	}

	m.markDeleted("a", at)
	m.markDeleted("a", at.Add(time.Second)) // the first deletion counts
	if got, ok := m.takeDeleted("a"); !ok || !got.Equal(at) {
		t.Fatalf("takeDeleted %v %v, want the first, %v", got, ok, at)
	}
	m.markDeleted("a", at)
	m.forgetDeletion("a")
	if _, ok := m.takeDeleted("a"); ok {
		t.Fatal("a forgotten deletion is still there")
	}

	m.setEnding("c", 1, at)
	m.markDeleted("c", at)
	m.refreshInterval("c", time.Second, at)
	m.forget("c")
	if _, ok := m.ending("c", 1); ok || m.refreshDue("c", at.Add(time.Hour)) {
		t.Fatal("forget left something of c")
	}
	if _, ok := m.takeDeleted("c"); ok {
		t.Fatal("forget left c's deletion")
	}
}

// Workers reconcile different Leases at once.
func TestLeaseMemoryIsSafeForConcurrentUse(t *testing.T) {
	m := newLeaseMemory()
	now := time.Now()
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			key := fmt.Sprintf("l%d", i)
			for range 100 {
				m.refreshInterval(key, time.Second, now)
				m.setEnding(key, 1, now)
				m.markDeleted(key, now)
				m.takeEnding(key, 1)
				m.takeDeleted(key)
				m.forget(key)
			}
		})
	}
	wg.Wait()
}

// What one pass asks of the memory: a release remembers its reason and
// starts the failover clock, the next grant takes both, and a pass with no
// successor coming forgets them.
func TestLeaseMemoryAlongAPass(t *testing.T) {
	m := newLeaseMemory()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ttl := 15 * time.Second

	m.setEnding("k", 1, t0.Add(ttl))
	if due, next := m.renewing("k", ttl, t0); due || next != statusRefresh {
		t.Fatalf("renewing: due %v, next %s; want a first slot %s away", due, next, statusRefresh)
	}
	if _, ok := m.ending("k", 1); ok {
		t.Fatal("renewing left the tenure being ended")
	}
	if due, _ := m.renewing("k", ttl, t0.Add(statusRefresh)); !due {
		t.Fatal("the refresh slot came and renewing did not say so")
	}

	m.released("k", 7, fencerv1.TenureHolderGone, t0)
	if why, ok := m.endedReason("k", 7); !ok || why != fencerv1.TenureHolderGone {
		t.Fatalf("released: reason %q %v", why, ok)
	}
	if m.refreshDue("k", t0.Add(time.Hour)) {
		t.Fatal("released kept a refresh slot")
	}
	if why, endedHere, wasEnding := m.lapsed("k", 7); !endedHere || why != fencerv1.TenureHolderGone || wasEnding {
		t.Fatalf("lapsed after our release: %q %v %v", why, endedHere, wasEnding)
	}
	if _, endedHere, _ := m.lapsed("k", 8); endedHere {
		t.Fatal("a reason of token 7 was given for token 8")
	}

	deletedAt, failover, refresh := m.granted("k", ttl, t0.Add(time.Second))
	if !failover || !deletedAt.Equal(t0) || refresh < statusRefresh {
		t.Fatalf("granted: deleted %s (%v), refresh %s", deletedAt, failover, refresh)
	}
	if _, failover, refresh := m.granted("k", 0, t0); failover || refresh != 0 {
		t.Fatalf("a second grant found a failover (%v) or a Direct grant got a slot (%s)", failover, refresh)
	}

	m.setEnding("k", 9, t0)
	if _, _, wasEnding := m.lapsed("k", 9); !wasEnding {
		t.Fatal("lapsed did not see the tenure being ended")
	}
	m.released("k", 9, fencerv1.TenureSuspended, t0)
	m.noGrant("k", true)
	if _, ok := m.endedReason("k", 9); !ok {
		t.Fatal("a pass with a successor coming forgot the reason")
	}
	m.noGrant("k", false)
	if _, ok := m.endedReason("k", 9); ok {
		t.Fatal("a pass with no successor coming kept the reason")
	}
	if _, failover, _ := m.granted("k", 0, t0); failover {
		t.Fatal("a grant after no successor was coming counted as a failover")
	}
}

// Leases get fencer's finalizer only in the namespaces the Lease deletion
// webhook skips, or everywhere when no webhook is served.
func TestFinalizerOnlyWhereNoWebhookReleases(t *testing.T) {
	r := &LeaseReconciler{Finalize: FinalizeIn([]string{"kube-system"}, false)}
	if got := r.finalizerFor("kube-system"); got != "fencer.io/release" {
		t.Errorf("kube-system: finalizer %q, want fencer.io/release", got)
	}
	if got := r.finalizerFor("apps"); got != "" {
		t.Errorf("apps: finalizer %q, want none", got)
	}
	if got := (&LeaseReconciler{Finalize: FinalizeIn(nil, true)}).finalizerFor("apps"); got != "fencer.io/release" {
		t.Errorf("no webhook served: finalizer %q, want fencer.io/release", got)
	}
	if got := (&LeaseReconciler{}).finalizerFor("apps"); got != "fencer.io/release" {
		t.Errorf("no Finalize set: finalizer %q, want fencer.io/release", got)
	}
}
