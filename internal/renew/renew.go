// Package renew keeps the etcd leases of PodReady grants and IDRange slots
// alive, and remembers when each was last renewed, so the controller can
// end a tenure exactly one TTL after its last renewal.
//
// All leases share one keepalive stream, one goroutine that sends and one
// that receives, as etcd's own client does inside; but etcd's KeepAlive
// API adds a channel and two goroutines per lease (the caller's reader and
// the client's context closer). At 10,000 held Leases those were 20,000
// goroutines and most of the manager's memory beyond its heap.
package renew

import (
	"context"
	"errors"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/utils/clock"
)

const (
	// tick is how often due keepalives are sent and overdue leases reaped,
	// as etcd's client does (its retryConnWait).
	tick = 500 * time.Millisecond
	// firstAnswer is how long a lease may wait for its first answer before
	// it counts as lost, as etcd's client waits (its defaultTTL).
	firstAnswer = 5 * time.Second
	// maxBackoff caps the wait between attempts to open the stream.
	maxBackoff = 2 * time.Second
)

// Renewer keeps a set of etcd leases alive, one per lease key.
type Renewer struct {
	cli *clientv3.Client
	// clock stamps lastRenew, which the controller compares with its own
	// clock. The keepalives themselves run on real time: etcd expires
	// leases on real time, whatever a test's clock says.
	clock clock.Clock
	// lost is called, outside any lock, when a lease stops being renewed on
	// its own (expired or revoked in etcd, or no answer for longer than its
	// TTL).
	lost func(key string)

	start sync.Once
	kick  chan struct{} // a new lease to send for now
	reset chan struct{} // the stream stopped answering: open another

	mu      sync.Mutex
	entries map[string]*entry
	byID    map[clientv3.LeaseID]*entry
	// gone are keys to report lost, delivered by their own goroutine so a
	// slow callback never stalls the stream.
	gone     []string
	goneWake chan struct{}
	// closed is closed once the client closed and every lease was queued
	// as lost.
	closed chan struct{}
}

type entry struct {
	key       string
	id        clientv3.LeaseID
	lastRenew time.Time
	// nextSend is when to send the next keepalive: now for a new lease,
	// then TTL/3 after each answer, as etcd's client does.
	nextSend time.Time
	// deadline is when the lease counts as lost without an answer: TTL
	// after the last answer, firstAnswer after it was added.
	deadline time.Time
	answered bool
	// suspended: no keepalive is sent until Ensure resumes it or Stop
	// ends it, and it is never reaped as lost: the caller decides.
	suspended bool
}

// New returns a Renewer; lost may be nil. Its stream runs until cli is
// closed.
func New(cli *clientv3.Client, clk clock.Clock, lost func(key string)) *Renewer {
	return &Renewer{cli: cli, clock: clk, lost: lost, kick: make(chan struct{}, 1), reset: make(chan struct{}, 1),
		goneWake: make(chan struct{}, 1), closed: make(chan struct{}), entries: map[string]*entry{}, byID: map[clientv3.LeaseID]*entry{}}
}

// Ensure keeps lease id alive for key, unless it already is; a suspended
// one is resumed, with a keepalive at once. since is when
// the lease was last known renewed (its grant time for a fresh grant). A
// lease for another id under the same key is no longer renewed.
func (r *Renewer) Ensure(key string, id clientv3.LeaseID, since time.Time) {
	r.start.Do(func() {
		go r.run()
		go r.watchDeadlines()
		go r.deliver()
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	if e, ok := r.entries[key]; ok {
		if e.id == id {
			r.resumeLocked(e)
			return
		}
		r.removeLocked(e)
	}
	now := time.Now()
	if other, ok := r.byID[id]; ok {
		// One etcd lease renewed for two keys: the older key loses it.
		r.removeLocked(other)
		r.goneLocked(other.key)
	}
	e := &entry{key: key, id: id, lastRenew: since, nextSend: now, deadline: now.Add(firstAnswer)}
	r.entries[key] = e
	r.byID[id] = e
	r.kickLocked()
}

// kickLocked has the stream send what is due now.
func (r *Renewer) kickLocked() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// Resume renews key's lease id again if it was suspended, with a keepalive
// at once. It never starts renewing a lease: once Stop has ended it, or
// another id replaced it, there is nothing to resume. It reports whether
// it resumed anything.
func (r *Renewer) Resume(key string, id clientv3.LeaseID) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.entries[key]
	if !ok || e.id != id || !e.suspended {
		return false
	}
	r.resumeLocked(e)
	return true
}

// resumeLocked sends a suspended lease's keepalive now; its deadline is a
// new lease's, since no answer was asked for while it was suspended.
func (r *Renewer) resumeLocked(e *entry) {
	if !e.suspended {
		return
	}
	now := time.Now()
	e.suspended, e.nextSend, e.deadline = false, now, now.Add(firstAnswer)
	r.kickLocked()
}

// Suspended reports whether key's lease is suspended.
func (r *Renewer) Suspended(key string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.entries[key]
	return ok && e.suspended
}

// Suspend stops sending keepalives for key's lease id at once, keeping its
// last renewal for Stop: the caller heard that the holder stopped
// qualifying, and no renewal may land between that moment and the
// reconcile that acts on it. Resume or Ensure resumes it; a key renewed
// under another id is left alone. It reports whether it suspended anything.
func (r *Renewer) Suspend(key string, id clientv3.LeaseID) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.entries[key]
	if !ok || e.id != id || e.suspended {
		return false
	}
	e.suspended = true
	return true
}

func (r *Renewer) removeLocked(e *entry) {
	if r.entries[e.key] == e {
		delete(r.entries, e.key)
	}
	if r.byID[e.id] == e {
		delete(r.byID, e.id)
	}
}

// run keeps a keepalive stream open until the client is closed.
func (r *Renewer) run() {
	ctx := clientv3.WithRequireLeader(r.cli.Ctx())
	backoff := tick
	for ctx.Err() == nil {
		opened := time.Now()
		_ = r.stream(ctx) // the deadlines, not the error, decide what is lost
		if time.Since(opened) > maxBackoff {
			backoff = tick
		}
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// stream sends due keepalives on one stream and hands its answers to
// answer, until the stream fails.
func (r *Renewer) stream(ctx context.Context) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := clientv3.RetryLeaseClient(r.cli).LeaseKeepAlive(sctx)
	if err != nil {
		return err
	}
	recvErr := make(chan error, 1)
	go func() {
		for {
			resp, err := st.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			r.answer(clientv3.LeaseID(resp.ID), resp.TTL)
		}
	}()
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		for _, id := range r.due() {
			if !r.stillRenewed(id) {
				continue // stopped since due() listed it
			}
			if err := st.Send(&pb.LeaseKeepAliveRequest{ID: int64(id)}); err != nil {
				return err
			}
		}
		select {
		case <-t.C:
		case <-r.kick:
		case <-r.reset:
			return errors.New("leases went unanswered on this stream")
		case err := <-recvErr:
			return err
		case <-sctx.Done():
			return sctx.Err()
		}
	}
}

func (r *Renewer) stillRenewed(id clientv3.LeaseID) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.byID[id]
	return ok && !e.suspended
}

// due lists the leases whose keepalive is due. Until a lease's answer
// comes, it is sent again a tick later, as etcd's client does; a kick
// for a new lease sends only the new one.
func (r *Renewer) due() []clientv3.LeaseID {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	var ids []clientv3.LeaseID
	for id, e := range r.byID {
		if !e.suspended && !e.nextSend.After(now) {
			ids = append(ids, id)
			e.nextSend = now.Add(tick)
		}
	}
	return ids
}

// answer records etcd's answer to a keepalive: renewed for ttl seconds,
// or, at ttl <= 0, expired or revoked.
func (r *Renewer) answer(id clientv3.LeaseID, ttl int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.byID[id]
	if !ok {
		return // no longer renewed
	}
	if ttl <= 0 {
		r.removeLocked(e)
		r.goneLocked(e.key)
		return
	}
	now := time.Now()
	d := time.Duration(ttl) * time.Second
	e.lastRenew = r.clock.Now()
	e.nextSend = now.Add(d / 3)
	e.deadline = now.Add(d)
	e.answered = true
}

// watchDeadlines reaps leases past their deadline every second, apart
// from the stream, so a stream stuck opening or sending still has its
// leases reported lost. When the client closes, every lease is lost.
func (r *Renewer) watchDeadlines() {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-r.cli.Ctx().Done():
			r.mu.Lock()
			for _, e := range r.byID {
				r.goneLocked(e.key)
			}
			r.entries = map[string]*entry{}
			r.byID = map[clientv3.LeaseID]*entry{}
			r.mu.Unlock()
			close(r.closed)
			return
		case <-t.C:
			r.reap()
		}
	}
}

// reap drops the leases that had no answer by their deadline: etcd may
// have expired them. A lease that had answers before and then none means
// the stream stopped answering: it is replaced, perhaps by one to another
// member.
func (r *Renewer) reap() {
	now := time.Now()
	stalled := false
	r.mu.Lock()
	for _, e := range r.byID {
		if !e.suspended && e.deadline.Before(now) {
			stalled = stalled || e.answered
			r.removeLocked(e)
			r.goneLocked(e.key)
		}
	}
	r.mu.Unlock()
	if stalled {
		select {
		case r.reset <- struct{}{}:
		default:
		}
	}
}

// goneLocked queues key to be reported lost.
func (r *Renewer) goneLocked(key string) {
	r.gone = append(r.gone, key)
	select {
	case r.goneWake <- struct{}{}:
	default:
	}
}

// deliver calls lost for each queued key, in order, outside the lock.
func (r *Renewer) deliver() {
	for {
		closed := false
		select {
		case <-r.goneWake:
		case <-r.closed:
			closed = true
		}
		r.mu.Lock()
		keys := r.gone
		r.gone = nil
		r.mu.Unlock()
		for _, key := range keys {
			if r.lost != nil {
				r.lost(key)
			}
		}
		if closed {
			return
		}
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
	r.removeLocked(e)
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

// Renewing reports whether lease id is being renewed for key (not
// suspended).
func (r *Renewer) Renewing(key string, id clientv3.LeaseID) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.entries[key]
	return ok && e.id == id && !e.suspended
}

// StopAll stops renewing every lease; they then expire on their own TTLs
// unless a successor adopts them.
func (r *Renewer) StopAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.entries = map[string]*entry{}
	r.byID = map[clientv3.LeaseID]*entry{}
}
