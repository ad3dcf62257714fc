// Package renew keeps the etcd leases of PodReady grants alive with etcd's
// streaming KeepAlive, and remembers when each was last renewed, so the
// controller can end a tenure exactly one TTL after its last renewal.
package renew

import (
	"context"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/utils/clock"
)

// Renewer keeps a set of etcd leases alive, one per lease key.
type Renewer struct {
	cli   *clientv3.Client
	clock clock.Clock
	// lost is called, outside any lock, when a lease stops being renewed on
	// its own (expired or revoked in etcd, or keepalive failed for longer
	// than its TTL).
	lost func(key string)

	mu      sync.Mutex
	entries map[string]*entry
}

type entry struct {
	id        clientv3.LeaseID
	cancel    context.CancelFunc
	lastRenew time.Time
}

// New returns a Renewer; lost may be nil.
func New(cli *clientv3.Client, clk clock.Clock, lost func(key string)) *Renewer {
	return &Renewer{cli: cli, clock: clk, lost: lost, entries: map[string]*entry{}}
}

// Ensure keeps lease id alive for key, starting a KeepAlive stream unless one
// already runs for that id. since is when the lease was last known renewed
// (its grant time for a fresh grant). A stream for another id under the same
// key is stopped first.
func (r *Renewer) Ensure(key string, id clientv3.LeaseID, since time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e, ok := r.entries[key]; ok {
		if e.id == id {
			return
		}
		e.cancel()
	}
	ctx, cancel := context.WithCancel(context.Background())
	e := &entry{id: id, cancel: cancel, lastRenew: since}
	r.entries[key] = e
	go r.keepAlive(ctx, key, e)
}

func (r *Renewer) keepAlive(ctx context.Context, key string, e *entry) {
	ch, err := r.cli.KeepAlive(ctx, e.id)
	if err == nil {
		for resp := range ch {
			if resp.TTL <= 0 {
				break
			}
			r.mu.Lock()
			e.lastRenew = r.clock.Now()
			r.mu.Unlock()
		}
	}
	if ctx.Err() != nil {
		return // stopped on purpose
	}
	r.mu.Lock()
	if r.entries[key] == e {
		delete(r.entries, key)
	}
	r.mu.Unlock()
	if r.lost != nil {
		r.lost(key)
	}
}

// Stop stops renewing key's lease and returns when it was last renewed.
// ok is false when nothing was being renewed for key.
func (r *Renewer) Stop(key string) (lastRenew time.Time, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.entries[key]
	if !ok {
		return time.Time{}, false
	}
	e.cancel()
	delete(r.entries, key)
	return e.lastRenew, true
}

// LastRenew returns when key's lease was last renewed, if it is being renewed.
func (r *Renewer) LastRenew(key string) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.entries[key]
	if !ok {
		return time.Time{}, false
	}
	return e.lastRenew, true
}

// Len is how many leases are being renewed.
func (r *Renewer) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.entries)
}

// Renewing reports whether lease id is being renewed for key.
func (r *Renewer) Renewing(key string, id clientv3.LeaseID) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.entries[key]
	return ok && e.id == id
}

// StopAll stops every stream; the leases then expire on their own TTLs
// unless a successor adopts them.
func (r *Renewer) StopAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for k, e := range r.entries {
		e.cancel()
		delete(r.entries, k)
	}
}
