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

// leaseMemory is what the Lease reconciler remembers of each Lease between
// reconciles, by lease key: none of it is in the Lease or in etcd, and a
// new leader starts without it. Its methods are safe for concurrent use:
// several workers reconcile different Leases at once.
type leaseMemory struct {
	mu sync.Mutex
	// endAt is when a PodReady tenure whose holder stopped qualifying ends:
	// one TTL after its last renewal.
	endAt map[string]time.Time
	// deletedAt is when the etcd watch saw a lease key go, for the failover
	// duration metric.
	deletedAt map[string]time.Time
	// refreshAt is each held Lease's next status refresh slot, and
	// lastRefresh the latest slot handed out (refreshInterval).
	refreshAt   map[string]time.Time
	lastRefresh time.Time
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
	return &leaseMemory{endAt: map[string]time.Time{}, deletedAt: map[string]time.Time{}, refreshAt: map[string]time.Time{}, ended: map[string]endedTenure{}}
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

// forgetRefresh drops key's refresh slot: its status is fresh, or its
// tenure over.
func (m *leaseMemory) forgetRefresh(key string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.refreshAt, key)
}

// ending is when key's unrenewed tenure ends, if that was decided.
func (m *leaseMemory) ending(key string) (time.Time, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	at, ok := m.endAt[key]
	return at, ok
}

// setEnding records when key's unrenewed tenure ends.
func (m *leaseMemory) setEnding(key string, at time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.endAt[key] = at
}

// takeEnding reports, and forgets, whether key's tenure was being ended.
func (m *leaseMemory) takeEnding(key string) (time.Time, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	at, ok := m.endAt[key]
	delete(m.endAt, key)
	return at, ok
}

// clearEnding forgets that key's tenure was being ended: its holder
// qualifies again, or the tenure is over.
func (m *leaseMemory) clearEnding(key string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.endAt, key)
}

// markDeleted records when key was seen deleted, keeping the first time.
func (m *leaseMemory) markDeleted(key string, at time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.deletedAt[key]; !ok {
		m.deletedAt[key] = at
	}
}

// takeDeleted reports, and forgets, when key was seen deleted.
func (m *leaseMemory) takeDeleted(key string) (time.Time, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	at, ok := m.deletedAt[key]
	delete(m.deletedAt, key)
	return at, ok
}

// forgetDeletion drops key's deletion time: no successor is coming soon,
// so a later grant is no failover.
func (m *leaseMemory) forgetDeletion(key string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.deletedAt, key)
	delete(m.ended, key)
}

// setEnded records why this replica ended key's tenure under token.
func (m *leaseMemory) setEnded(key string, token int64, why fencerv1.TenureEndReason) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ended[key] = endedTenure{token: token, why: why}
}

// endedReason is why this replica ended key's tenure under token, if it did.
func (m *leaseMemory) endedReason(key string, token int64) (fencerv1.TenureEndReason, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.ended[key]
	return e.why, ok && e.token == token
}

// forget drops all that is remembered of key, a Lease that is gone.
func (m *leaseMemory) forget(key string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.refreshAt, key)
	delete(m.endAt, key)
	delete(m.deletedAt, key)
}
