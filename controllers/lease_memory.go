package controllers

import (
	"sync"
	"time"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
)

// statusRefresh is how often a held Lease's status (renewTime, expireTime)
// is refreshed while nothing else changes. Renewals themselves happen in
// etcd every TTL/3; writing each to the apiserver would cost more than it
// tells.
const statusRefresh = 30 * time.Second

// statusRefreshRate caps those refreshes, over all held Leases, in writes
// per second: with 10,000 Leases a 30 s refresh would cost 333 writes/s for
// a timestamp, so the interval grows with the number held instead.
const statusRefreshRate = 10

// grantBurstWindow is how recent a grant must be for a due refresh to yield
// to grants (refreshYields): grants this close together are a burst, in
// which the apiserver is what every waiting candidate queues for.
const grantBurstWindow = time.Second

// leaseMemory is what the Lease reconciler remembers of each Lease between
// reconciles, by lease key: none of it is in the Lease or in etcd, and a
// new leader starts without it. Its methods are safe for concurrent use:
// several workers reconcile different Leases at once.
type leaseMemory struct {
	mu sync.Mutex
	// endAt is when a PodReady tenure whose holder stopped qualifying ends:
	// one TTL after its last renewal. It is kept with the tenure's token: a
	// replica that loses its term while ending one grant, and leads again
	// over another replica's later grant, must not end that one early.
	endAt map[string]tenureEnding
	// deletedAt is when the etcd watch saw a lease key go, for the failover
	// duration metric.
	deletedAt map[string]time.Time
	// refreshAt is each held Lease's next status refresh slot, and
	// lastRefresh the latest slot handed out (refreshInterval).
	refreshAt   map[string]time.Time
	lastRefresh time.Time
	// yielded holds the Leases whose due refresh yielded to a burst of
	// grants since their status was last refreshed, and lastGrant is when
	// the latest grant was made (refreshYields).
	yielded   map[string]bool
	lastGrant time.Time
	// ended is why this replica last ended each Lease's tenure, by token,
	// so that a status write that conflicts does not lose the reason: the
	// next pass records the end from here.
	ended map[string]endedTenure
}

type endedTenure struct {
	token int64
	why   fencerv1.TenureEndReason
}

func newLeaseMemory() *leaseMemory {
	return &leaseMemory{endAt: map[string]tenureEnding{}, deletedAt: map[string]time.Time{}, refreshAt: map[string]time.Time{}, yielded: map[string]bool{}, ended: map[string]endedTenure{}}
}

// refreshInterval is when a held Lease's status is next refreshed. A Lease
// with a refresh still ahead keeps it. Otherwise it gets a new slot, at
// least statusRefresh from now and 1/statusRefreshRate after the latest
// slot handed out, or one TTL from now if that is later. Slots are handed
// out in order, so refreshes never come faster than statusRefreshRate,
// even after a burst of grants, when every Lease granted at once would
// otherwise be due at once. A long TTL delays only its own Lease.
func (m *leaseMemory) refreshInterval(key string, ttl time.Duration, now time.Time) time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	if at, ok := m.refreshAt[key]; ok && at.After(now) {
		return at.Sub(now)
	}
	slot := now.Add(statusRefresh)
	if next := m.lastRefresh.Add(time.Second / statusRefreshRate); slot.Before(next) {
		slot = next
	}
	m.lastRefresh = slot
	at := slot
	if long := now.Add(ttl); at.Before(long) {
		at = long
	}
	m.refreshAt[key] = at
	return at.Sub(now)
}

// refreshDue reports whether key's status refresh slot has come. A Lease
// without a slot (a grant adopted from another replica) keeps the renewal
// shown until it gets one; showRenewal replaces one that is not of this
// grant.
func (m *leaseMemory) refreshDue(key string, now time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	at, ok := m.refreshAt[key]
	return ok && !now.Before(at)
}

// refreshYields reports whether key's due refresh yields to a burst of
// grants: a grant was made within grantBurstWindow of now, and key has not
// yielded since its status was last refreshed. A refresh that yields takes
// the next slot (refreshInterval), after every slot the burst's grants
// took, so a burst's apiserver writes go to the grants that candidates
// wait for, not to renewTimes nobody waits for. It yields once: its next
// slot refreshes it, burst or not, so no status goes unrefreshed for more
// than two of its slots. It decides the refresh, and records it: call it
// only for a refresh that is due.
func (m *leaseMemory) refreshYields(key string, now time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.yielded[key] || now.Sub(m.lastGrant) >= grantBurstWindow {
		delete(m.yielded, key)
		return false
	}
	m.yielded[key] = true
	return true
}

// noteGrant records that a grant was made at now (refreshYields).
func (m *leaseMemory) noteGrant(now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if now.After(m.lastGrant) {
		m.lastGrant = now
	}
}

// forgetRefresh drops key's refresh slot: its status is fresh, or its
// tenure over.
func (m *leaseMemory) forgetRefresh(key string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.refreshAt, key)
	delete(m.yielded, key)
}

// tenureEnding is when the tenure under token ends.
type tenureEnding struct {
	token int64
	at    time.Time
}

// ending is when key's unrenewed tenure under token ends, if that was
// decided.
func (m *leaseMemory) ending(key string, token int64) (time.Time, bool) {
	e, ok := lookup(m, m.endAt, key, false)
	return e.at, ok && e.token == token
}

// setEnding records when key's unrenewed tenure under token ends.
func (m *leaseMemory) setEnding(key string, token int64, at time.Time) {
	store(m, m.endAt, key, tenureEnding{token: token, at: at}, true)
}

// takeEnding reports, and forgets, whether key's tenure under token was
// being ended.
func (m *leaseMemory) takeEnding(key string, token int64) (time.Time, bool) {
	e, ok := lookup(m, m.endAt, key, true)
	return e.at, ok && e.token == token
}

// clearEnding forgets that key's tenure was being ended: its holder
// qualifies again, or the tenure is over.
func (m *leaseMemory) clearEnding(key string) { lookup(m, m.endAt, key, true) }

// markDeleted records when key was seen deleted, keeping the first time.
func (m *leaseMemory) markDeleted(key string, at time.Time) { store(m, m.deletedAt, key, at, false) }

// takeDeleted reports, and forgets, when key was seen deleted.
func (m *leaseMemory) takeDeleted(key string) (time.Time, bool) {
	return lookup(m, m.deletedAt, key, true)
}

// forgetDeletion drops key's deletion time: no successor is coming soon,
// so a later grant is no failover.
func (m *leaseMemory) forgetDeletion(key string) {
	lookup(m, m.deletedAt, key, true)
	lookup(m, m.ended, key, true)
}

// lookup reads key from one of m's maps under m's lock, deleting it when
// take is set.
func lookup[V any](m *leaseMemory, values map[string]V, key string, take bool) (V, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	v, ok := values[key]
	if take {
		delete(values, key)
	}
	return v, ok
}

// store writes key into one of m's maps under m's lock; an existing value
// is kept unless replace is set.
func store[V any](m *leaseMemory, values map[string]V, key string, v V, replace bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := values[key]; ok && !replace {
		return
	}
	values[key] = v
}

// setEnded records why this replica ended key's tenure under token.
func (m *leaseMemory) setEnded(key string, token int64, why fencerv1.TenureEndReason) {
	store(m, m.ended, key, endedTenure{token: token, why: why}, true)
}

// endedReason is why this replica ended key's tenure under token, if it did.
func (m *leaseMemory) endedReason(key string, token int64) (fencerv1.TenureEndReason, bool) {
	e, ok := lookup(m, m.ended, key, false)
	return e.why, ok && e.token == token
}

// forget drops all that is remembered of key, a Lease that is gone.
func (m *leaseMemory) forget(key string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.refreshAt, key)
	delete(m.yielded, key)
	delete(m.endAt, key)
	delete(m.deletedAt, key)
}

// The methods below are what one reconcile pass asks of the memory, one
// call per step, so that following a Lease through a pass visits this file
// once or twice.

// renewing is a pass over a holder the controller renews: its tenure is no
// longer being ended, due says whether its status refresh has come (and
// does not yield to a burst of grants: refreshYields), and next is when the
// status is next refreshed (refreshInterval).
func (m *leaseMemory) renewing(key string, ttl time.Duration, now time.Time) (due bool, next time.Duration) {
	m.clearEnding(key)
	due = m.refreshDue(key, now) && !m.refreshYields(key, now)
	return due, m.refreshInterval(key, ttl, now)
}

// released records that this replica ended key's tenure under token, for
// why, at at: no refresh or ending is pending, the failover clock starts
// (unless the etcd watch saw the key go first), and the reason is kept
// until a status shows it.
func (m *leaseMemory) released(key string, token int64, why fencerv1.TenureEndReason, at time.Time) {
	m.forgetRefresh(key)
	m.clearEnding(key)
	m.markDeleted(key, at)
	m.setEnded(key, token, why)
}

// dropped records that a grant never issued as a tenure (a regressed or
// unissued one) was deleted: nothing of it is pending.
func (m *leaseMemory) dropped(key string) {
	m.forgetRefresh(key)
	m.clearEnding(key)
}

// lapsed tells how this replica saw the tenure under token end, now that
// its key is found empty: it ended it itself, for why (its status write was
// lost), or was ending it (the holder stopped qualifying and was no longer
// renewed), or neither. The ending is forgotten.
func (m *leaseMemory) lapsed(key string, token int64) (why fencerv1.TenureEndReason, endedHere, wasEnding bool) {
	why, endedHere = m.endedReason(key, token)
	_, wasEnding = m.takeEnding(key, token)
	return why, endedHere, wasEnding
}

// noGrant records a pass that ends with no grant live. With no successor
// coming (suspended, or no candidate), a later grant is no failover.
func (m *leaseMemory) noGrant(key string, successorComing bool) {
	m.forgetRefresh(key)
	if !successorComing {
		m.forgetDeletion(key)
	}
}

// granted records a new grant at now. It returns when its predecessor's
// key was seen deleted (ok false when that is not known: no failover to
// time), and, for a grant the controller renews (ttl above zero), when its
// status is first refreshed: its status is fresh, so the reconciles its
// own writes cause have nothing to write.
func (m *leaseMemory) granted(key string, ttl time.Duration, now time.Time) (deletedAt time.Time, ok bool, refresh time.Duration) {
	deletedAt, ok = m.takeDeleted(key)
	m.forgetRefresh(key)
	m.noteGrant(now)
	if ttl > 0 {
		refresh = m.refreshInterval(key, ttl, now)
	}
	return deletedAt, ok, refresh
}
