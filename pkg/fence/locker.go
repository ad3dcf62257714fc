package fence

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/fencer-io/fencer/internal/etcdreply"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
)

// DefaultLockTTL is the TTL of a Locker's etcd session unless
// LockerOptions.TTL says otherwise: a process that stops renewing it (paused,
// cut off, dead) loses every lock it holds this long after its last
// keepalive was sent. It is the Lease's default ttlSeconds.
const DefaultLockTTL = 15 * time.Second

// DefaultLockTimeout bounds each etcd call of a Locker unless
// LockerOptions.Timeout says otherwise: with etcd unreachable, Lock and
// Unlock fail after this long instead of hanging.
const DefaultLockTimeout = 5 * time.Second

var (
	// ErrLockLost is the cause of a held lock's Context ending without
	// Unlock: its session's keepalive failed or its TTL ran out, its etcd
	// lease was revoked, or its waiter key was deleted. Unlock returns it,
	// having deleted nothing of anyone else's, for a lock already lost.
	ErrLockLost = errors.New("fence: the lock was lost")
	// ErrLockBusy is returned by TryLock when the lock was not free within
	// the wait it was given.
	ErrLockBusy = errors.New("fence: the lock is held by another")
	// ErrEtcdUnavailable wraps the error of an etcd call that did not
	// complete within LockerOptions.Timeout.
	ErrEtcdUnavailable = errors.New("fence: etcd is unreachable")
	// ErrLockerClosed is returned by a Lock called after Close, or still
	// waiting for its turn when Close came. It never held the lock, so it
	// is not ErrLockLost; the locks Close ends while held are.
	ErrLockerClosed = errors.New("fence: the Locker was closed")
	// ErrEtcdRegressed is returned by Lock while fencer finds etcd's
	// revision below one it already saw (etcd restored from an old snapshot
	// without --bump-revision): a lock granted now could reissue a token.
	ErrEtcdRegressed = errors.New("fence: etcd went back in time; keyed locks are closed until its revision passes the last one fencer saw")
)

// LockerOptions configure a Locker.
type LockerOptions struct {
	// Pod and PodUID name the holder in each lock's value, for `kubectl
	// fencer locks`. They are informational: the fence is the token.
	Pod, PodUID string
	// TTL is the session's TTL (DefaultLockTTL when zero), at least 2 s:
	// etcd grants whole seconds.
	TTL time.Duration
	// Timeout bounds each etcd call (DefaultLockTimeout when zero).
	Timeout time.Duration
}

// A Locker takes keyed locks in one namespace for one process. All its
// locks share one etcd session: an etcd lease kept alive every TTL/3, to
// which every waiter key is attached. Losing the session (a keepalive gap
// of a whole TTL, or the lease revoked) loses every lock the process holds.
// Each acquisition has a waiter key of its own, so two goroutines never
// share a lock, and a late Unlock never removes a later acquisition.
// A Locker is safe for concurrent use; make one per process.
type Locker struct {
	cli       *clientv3.Client
	prefix    string
	namespace string
	opts      LockerOptions

	// ctx ends with Close, with errClosed; every session derives from it,
	// so a held lock's Context ends with ErrLockLost then too.
	ctx   context.Context
	close context.CancelCauseFunc

	mu       sync.Mutex
	sess     *lockSession
	granting *sessionGrant // the grant in flight, if any
	// maxRev is the highest etcd revision any answer carried (seen).
	maxRev atomic.Int64
	// deletions are the waiter keys still being deleted, which the next
	// Lock of their keys waits for.
	deletions deletions
}

// lockSession is one etcd lease shared by a Locker's locks. ctx ends, with
// a cause wrapping ErrLockLost, when the lease is lost.
//
// Each acquisition's waiter keys are named <lease>-<slot>. A slot is taken
// by one acquisition at a time and given back only once its keys are
// confirmed gone, so names are reused (etcd keeps an index entry for every
// key name until compaction, and a lock's queue read would otherwise walk
// one per acquisition ever made) while no two live acquisitions share one.
// Every delete compares the key's CreateRevision, so even a delete that
// arrives late cannot remove a later acquisition under the same name.
type lockSession struct {
	id   clientv3.LeaseID
	ctx  context.Context
	lose func(cause error)
	// marker is the session's marker key and markerVal its value. Every
	// queueing compares the marker's version with markerVer, the highest
	// the session has seen; retire puts the marker again, so that no
	// queueing sent before can apply after (retire.go).
	marker, markerVal string
	markerVer         atomic.Int64
	// markerRev is the revision the marker was created at: a marker of
	// another CreateRevision was deleted and put again by someone else,
	// and its version started over.
	markerRev int64

	mu   sync.Mutex
	free []uint64
	next uint64
	// retired are the acquisitions whose queueing had an unknown outcome,
	// waiting for the next fence; fencing is set while fenceOff runs.
	retired []*Lock
	fencing bool
}

// take is a slot no live acquisition of the session uses.
func (s *lockSession) take() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := len(s.free); n > 0 {
		slot := s.free[n-1]
		s.free = s.free[:n-1]
		return slot
	}
	s.next++
	return s.next
}

// give returns a slot whose keys are gone.
func (s *lockSession) give(slot uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.free = append(s.free, slot)
}

// errClosed is what Close ends the Locker's locks with.
var errClosed = fmt.Errorf("%w: %w", ErrLockLost, ErrLockerClosed)

// NewLocker makes the Locker of namespace, whose etcd identity cli
// connects as (LoadEtcdAccess), under fencer's key prefix. The session is
// created by the first Lock.
func NewLocker(cli *clientv3.Client, prefix, namespace string, opts LockerOptions) (*Locker, error) {
	if opts.TTL == 0 {
		opts.TTL = DefaultLockTTL
	}
	if opts.Timeout == 0 {
		opts.Timeout = DefaultLockTimeout
	}
	notLabel := validation.IsDNS1123Label(namespace)
	switch {
	case cli == nil:
		return nil, errors.New("fence: NewLocker needs an etcd client connected as the namespace's identity (LoadEtcdAccess)")
	case namespace == "":
		return nil, errors.New("fence: NewLocker needs the namespace whose locks it takes (the pod's own)")
	case len(notLabel) > 0:
		return nil, fmt.Errorf("fence: NewLocker's namespace %q is no Kubernetes namespace name: %s", namespace, strings.Join(notLabel, "; "))
	case opts.TTL < 2*time.Second:
		return nil, fmt.Errorf("fence: lock TTL %s is under 2s; etcd grants whole seconds and keepalives go every TTL/3", opts.TTL)
	case opts.Timeout < 0:
		return nil, fmt.Errorf("fence: lock timeout %s is negative", opts.Timeout)
	}
	if err := etcdkeys.CheckPrefix(etcdkeys.OrDefault(prefix)); err != nil {
		return nil, fmt.Errorf("fence: NewLocker: %w", err)
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	return &Locker{cli: cli, prefix: etcdkeys.OrDefault(prefix), namespace: namespace, opts: opts, ctx: ctx, close: cancel}, nil
}

// Close ends the session, releasing every lock the Locker holds at once
// (its etcd lease is revoked), and makes later Locks fail. Closing again,
// or a session etcd had already expired, is no error: its locks are gone
// either way. A Close whose revoke etcd did not answer may be called again.
func (l *Locker) Close(ctx context.Context) error {
	l.close(errClosed) // first: no session is granted after this
	l.mu.Lock()
	sess := l.sess
	l.mu.Unlock()
	if sess == nil {
		return nil
	}
	rctx, cancel := context.WithTimeout(ctx, l.opts.Timeout)
	defer cancel()
	if _, err := l.cli.Revoke(rctx, sess.id); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return fmt.Errorf("fence: revoking the lock session %x: %w", int64(sess.id), l.unavailable(rctx, err))
	}
	l.mu.Lock()
	if l.sess == sess {
		l.sess = nil
	}
	l.mu.Unlock()
	return nil
}

// session returns the live session, granting a new one if there is none
// or the last was lost. One grant runs at a time, in its own goroutine and
// outside l.mu: each caller waits for its outcome only as long as its own
// ctx allows. Close does not wait for it: a session it grants after Close
// is revoked at once (finishGrant), and carries no waiter key meanwhile.
func (l *Locker) session(ctx context.Context) (*lockSession, error) {
	l.mu.Lock()
	if err := l.ctx.Err(); err != nil {
		l.mu.Unlock()
		return nil, ErrLockerClosed
	}
	if l.sess != nil && l.sess.ctx.Err() == nil {
		sess := l.sess
		l.mu.Unlock()
		return sess, nil
	}
	g := l.granting
	if g == nil {
		if old := l.sess; old != nil {
			// Its keys would block their locks until etcd expires the lease.
			go l.revoke(old.id)
			l.sess = nil
		}
		g = &sessionGrant{done: make(chan struct{})}
		l.granting = g
		go l.finishGrant(g)
	}
	l.mu.Unlock()
	select {
	case <-g.done:
		return g.sess, g.err
	case <-ctx.Done():
		// ErrEtcdUnavailable when ctx's deadline ran out, as when it runs
		// out later in the Lock, queueing; the grant goes on for the rest.
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return nil, fmt.Errorf("fence: waiting for the lock session: %w (the caller's deadline came before etcd's answer): %w", ErrEtcdUnavailable, ctx.Err())
		}
		return nil, fmt.Errorf("fence: waiting for the lock session: %w", ctx.Err())
	}
}

// finishGrant runs grant g and publishes its outcome.
func (l *Locker) finishGrant(g *sessionGrant) {
	sess, err := l.grant(l.ctx)
	l.mu.Lock()
	if err == nil && l.ctx.Err() != nil { // Close came while it was granted
		go l.revoke(sess.id)
		sess, err = nil, ErrLockerClosed
	}
	if errors.Is(err, ErrLockerClosed) || l.ctx.Err() != nil {
		err = ErrLockerClosed
	}
	l.sess, l.granting = sess, nil
	l.mu.Unlock()
	g.sess, g.err = sess, err
	close(g.done)
}

// sessionGrant is a session grant in flight: done closes once sess or err
// is set.
type sessionGrant struct {
	done chan struct{}
	sess *lockSession
	err  error
}

// grant starts a session within the Timeout, granting again when etcd
// refuses a grant's marker as sessionUnusable.
func (l *Locker) grant(ctx context.Context) (*lockSession, error) {
	gctx, cancel := context.WithTimeout(ctx, l.opts.Timeout)
	defer cancel()
	var (
		sess *lockSession
		err  error
	)
	for range sessionGrantTries {
		if sess, err = l.startSession(gctx); err == nil || !sessionUnusable(err) {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("fence: starting the lock session: %w", l.unavailable(gctx, err))
	}
	return sess, nil
}

// startSession grants a session lease and puts its marker key on it
// (etcdkeys.LockSessionKey), after which no other namespace can list,
// revoke or attach to it. A marker etcd refuses as sessionUnusable means
// the lease was revoked or taken over in between: that lease is left to
// expire and the caller grants another.
func (l *Locker) startSession(ctx context.Context) (*lockSession, error) {
	// etcd's TTL runs from when it applies the grant, which is after this:
	// the keepalive deadline counts from here, never after etcd's expiry.
	sent := time.Now()
	resp, err := grantSession(ctx, l.cli, int64(l.opts.TTL/time.Second))
	if err != nil {
		return nil, err
	}
	rev, err := etcdreply.Revision(resp.ResponseHeader)
	if err != nil {
		// The etcd lease may exist; unused, with no keys, it expires with
		// its TTL. It is not revoked: its ID comes from the answer that
		// failed its check, and a wrong ID could end another session.
		return nil, err
	}
	l.seen(rev)
	id := resp.ID
	val, _ := json.Marshal(sessionMarker{Pod: l.opts.Pod, PodUID: l.opts.PodUID})
	marker := etcdkeys.LockSessionKey(l.prefix, l.namespace, int64(resp.ID))
	put, err := l.cli.Put(ctx, marker, string(val), clientv3.WithLease(id))
	if err == nil {
		rev, err = etcdreply.Revision(put.Header)
	}
	if err != nil {
		go l.revoke(id) // refused unless it is still ours; else it expires
		return nil, fmt.Errorf("putting the session's marker key on etcd lease %x: %w", resp.ID, err)
	}
	l.seen(rev)
	sctx, lose := context.WithCancelCause(l.ctx)
	sess := &lockSession{id: id, ctx: sctx, lose: func(cause error) { lose(fmt.Errorf("%w: %w", ErrLockLost, cause)) },
		marker: marker, markerVal: string(val), markerRev: rev}
	sess.markerVer.Store(1) // a new key: the lease ID is new
	go keepAliveFrom(sctx, sess.lose, l.cli, sess.id, time.Duration(resp.TTL)*time.Second, sent, true)
	return sess, nil
}

// revoke ends a session's etcd lease, best effort: its keys go at once.
func (l *Locker) revoke(id clientv3.LeaseID) {
	ctx, cancel := context.WithTimeout(context.Background(), l.opts.Timeout)
	defer cancel()
	_, _ = l.cli.Revoke(ctx, id)
}

// seen records a revision etcd answered at: the highest is what any
// request sent later must be answered at or above (behind).
func (l *Locker) seen(rev int64) {
	for {
		top := l.maxRev.Load()
		if rev <= top || l.maxRev.CompareAndSwap(top, rev) {
			return
		}
	}
}

// behind reports whether etcd answered a request at a revision below one
// it had answered at before the request was sent (sentAfter, the highest
// seen then): etcd went back in time (restored from an old snapshot
// without --bump-revision), and tokens would be issued again. Only answers
// to requests sent earlier may come back with lower revisions: concurrent
// requests are answered in any order.
func behind(rev, sentAfter int64) bool { return rev < sentAfter }

// unavailable marks err as ErrEtcdUnavailable when the call did not
// complete in time (ctx ran out) or etcd could not be reached.
func (l *Locker) unavailable(ctx context.Context, err error) error {
	switch {
	case errors.Is(err, ErrEtcdUnavailable):
		return err
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return fmt.Errorf("%w (no answer within %s): %w", ErrEtcdUnavailable, l.opts.Timeout, err)
	case unreachable(err):
		return fmt.Errorf("%w: %w", ErrEtcdUnavailable, err)
	}
	return err
}

// LockHolder is a keyed lock's waiter key value: who queued, and when.
// `kubectl fencer locks` shows it. Held is set once a waiter that queued
// behind others becomes holder; a waiter that found the lock free held it
// from Queued. It is informational: the fence is the token.
type LockHolder struct {
	Pod    string     `json:"pod,omitempty"`
	PodUID string     `json:"podUID,omitempty"`
	Queued time.Time  `json:"queued"`
	Held   *time.Time `json:"held,omitempty"`
}

// Lock takes the locks of keys, all of them, blocking until they are held
// or ctx ends. Taking a set never deadlocks against another set, whatever
// the order either names its keys in: one transaction queues the whole set
// at one etcd revision, and a waiter only ever waits for older revisions.
// Waiters on a key are served in the order they queued, and a release
// wakes only the next. Locks are not reentrant: locking a key this process
// already holds queues behind it. When ctx ends first, Lock returns ctx's
// error then, and its waiter keys are deleted in the background; this
// Locker's next Lock or TryLock of any of those keys waits for that
// deletion first, for up to the Timeout and within its own ctx.
func (l *Locker) Lock(ctx context.Context, keys ...string) (*Lock, error) {
	return l.lock(ctx, ctx, keys)
}

// TryLock is Lock that gives up when the keys are not all held within
// wait (zero: only if free now), returning ErrLockBusy, having deleted its
// waiter keys.
func (l *Locker) TryLock(ctx context.Context, wait time.Duration, keys ...string) (*Lock, error) {
	wctx, cancel := context.WithTimeoutCause(ctx, wait, ErrLockBusy)
	defer cancel()
	lk, err := l.lock(ctx, wctx, keys)
	// Only the wait running out is ErrLockBusy (lock returns wctx's
	// cause): a bad key, a closed Locker, a lost session or an unreachable
	// etcd keeps its own error, even when the wait has run out by then.
	if errors.Is(err, ErrLockBusy) {
		return nil, fmt.Errorf("%w: %q not free within %s", ErrLockBusy, keys, wait)
	}
	return lk, err
}

// lock queues keys and waits for their turn until waitCtx ends; ctx bounds
// the whole call.
func (l *Locker) lock(ctx, waitCtx context.Context, keys []string) (*Lock, error) {
	keys, err := lockKeys(keys)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	sess, err := l.session(ctx)
	if err != nil {
		return nil, err
	}
	if err := l.awaitDeletions(ctx, keys); err != nil {
		return nil, err
	}
	lk := &Lock{locker: l, sess: sess, keys: keys}
	ahead, err := l.enqueue(ctx, lk)
	for try := 1; try < enqueueTries && (errors.Is(err, errNameTaken) || errors.Is(err, errMarkerMoved)); try++ {
		ahead, err = l.enqueue(ctx, lk) // under a fresh slot, or the marker's new version
	}
	if errors.Is(err, errMarkerMoved) {
		err = fmt.Errorf("fence: queueing for %q: fenced off %d times in a row by this Locker's Locks that gave up mid-queueing (etcd answering slower than their deadlines): %w", keys, enqueueTries, ErrEtcdUnavailable)
	}
	if err != nil {
		return nil, l.notHeld(err) // Close may revoke the lease mid-queueing
	}
	if ahead {
		err = l.waitTurn(waitCtx, lk)
	}
	if err == nil && sess.ctx.Err() != nil {
		// Lost or closed while it queued, or as its turn came (waitTurn's
		// last read may reach etcd after Close, before the revoke): it
		// never held. Its keys go with the lease, but not at once.
		err = fmt.Errorf("fence: locking %q: %w", keys, context.Cause(sess.ctx))
	}
	if err != nil {
		// Only the wait ran out: decided before the clean-up, which ctx may
		// outlast (a caller who cancels during it still gets the wait's
		// answer). A session lost (or closed) first is the error even when
		// the wait has run out since.
		onlyWait := waitCtx.Err() != nil && ctx.Err() == nil && sess.ctx.Err() == nil
		l.abandon(ctx, lk)
		if onlyWait {
			return nil, context.Cause(waitCtx)
		}
		return nil, l.notHeld(err)
	}
	if ahead {
		go l.markHeld(lk)
	}
	lockMetrics.wait.Observe(time.Since(start).Seconds())
	lk.begin()
	return lk, nil
}

// awaitDeletions waits, within ctx and the Timeout, for the deletion of
// this Locker's own earlier waiter keys of keys (deletions). Past the
// Timeout, etcd has not confirmed a delete for that long: the Lock fails
// with ErrEtcdUnavailable, as it would in its own calls.
func (l *Locker) awaitDeletions(ctx context.Context, keys []string) error {
	pending := l.deletions.of(keys)
	if pending == nil {
		return nil // the common case, with no timer to set
	}
	wctx, cancel := context.WithTimeout(ctx, l.opts.Timeout)
	defer cancel()
	err := awaitAll(wctx, pending)
	const what = "fence: locking %q: waiting for this Locker's earlier waiter keys of them to be deleted: "
	switch {
	case err == nil:
		return nil
	case ctx.Err() == nil: // the Timeout ran out
		return fmt.Errorf(what+"%w (no deletion confirmed within %s)", keys, ErrEtcdUnavailable, l.opts.Timeout)
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return fmt.Errorf(what+"%w (the caller's deadline came before etcd's answer): %w", keys, ErrEtcdUnavailable, ctx.Err())
	}
	return fmt.Errorf(what+"%w", keys, ctx.Err())
}

// notHeld is the error of a Lock that ended before it held the lock:
// ErrLockerClosed, not ErrLockLost, once Close has run, whatever else
// went wrong at the same time.
func (l *Locker) notHeld(err error) error {
	if errors.Is(err, ErrLockerClosed) || l.ctx.Err() != nil {
		return ErrLockerClosed
	}
	return err
}

// lockKeys validates keys and refuses a key named twice: a set holds each
// key once.
func lockKeys(keys []string) ([]string, error) {
	if len(keys) == 0 {
		return nil, errors.New("fence: Lock needs at least one key")
	}
	for i, k := range keys {
		if err := etcdkeys.ValidLockKey(k); err != nil {
			return nil, fmt.Errorf("fence: %w", err)
		}
		if slices.Contains(keys[:i], k) {
			return nil, fmt.Errorf("fence: %w: %q is named twice in one set", etcdkeys.ErrBadLockKey, k)
		}
	}
	return slices.Clone(keys), nil
}

// errNameTaken: a waiter key of the slot enqueue took exists already. It
// cannot, while slots go back only once their keys are gone; enqueue
// leaves that slot out and the caller tries once more.
var errNameTaken = errors.New("fence: a waiter key of this slot exists")

// errMarkerMoved: the session's marker had a newer version than the
// queueing compared (a retire put it meanwhile); nothing was written, and
// the caller tries again with the new one.
var errMarkerMoved = errors.New("fence: the session's marker moved on")

// enqueueTries bounds enqueue's tries for one Lock: a name taken, or a
// marker moved by retires of the session's other Locks meanwhile.
const enqueueTries = 3

// enqueue writes the set's waiter keys in one transaction, reading in the
// same step the oldest waiter of each key. The transaction's revision is
// the token of every key of the set. It writes nothing while the lock
// floor key exists (the manager found etcd's revision gone back). It
// reports whether an older waiter is ahead on any key. Uncontended, this
// is the one round trip of etcd's own Mutex.Lock, of the same shape.
func (l *Locker) enqueue(ctx context.Context, lk *Lock) (ahead bool, err error) {
	lk.slot = lk.sess.take()
	lk.waiter = strconv.FormatInt(int64(lk.sess.id), 16) + "-" + strconv.FormatUint(lk.slot, 10)
	lk.queued = time.Now().UTC()
	val, _ := json.Marshal(LockHolder{Pod: l.opts.Pod, PodUID: l.opts.PodUID, Queued: lk.queued})
	ver := lk.sess.markerVer.Load()
	tctx, cancel := context.WithTimeout(ctx, l.opts.Timeout)
	defer cancel()
	sentAfter := l.maxRev.Load()
	resp, err := l.queueing(tctx, lk, string(val), ver).Commit()
	var reads [][]*mvccpb.KeyValue // each key's first waiter's, or the floor's and the marker's
	if err == nil {
		reads, err = enqueueReads(resp, len(lk.keys))
	}
	if err == nil {
		l.seen(resp.Header.Revision)
	}
	switch {
	case err != nil:
		if refused(err) {
			lk.sess.give(lk.slot) // etcd refused it: nothing was written
		} else {
			// The waiter keys may have been written, or may yet be: the
			// transaction can still apply after this. They must not
			// block their locks (retire).
			l.retire(lk)
		}
		if sessionUnusable(err) {
			// Nothing put under this session will succeed again: the next
			// Lock starts another.
			lk.sess.lose(fmt.Errorf("etcd refused a put under session lease %x: %w", int64(lk.sess.id), err))
			return false, fmt.Errorf("fence: queueing for %q: %w", lk.keys, context.Cause(lk.sess.ctx))
		}
		return false, fmt.Errorf("fence: queueing for %q: %w", lk.keys, l.unavailable(tctx, err))
	case behind(resp.Header.Revision, sentAfter):
		// etcd answers below a revision it gave before: it went back in
		// time, and this token may have been issued already.
		if resp.Succeeded {
			lk.token = resp.Header.Revision
			l.abandon(ctx, lk)
		}
		lk.sess.lose(fmt.Errorf("%w: revision %d after %d", ErrEtcdRegressed, resp.Header.Revision, sentAfter))
		go l.revoke(lk.sess.id)
		return false, fmt.Errorf("%w: etcd answered at revision %d after %d (see docs/operations.md)", ErrEtcdRegressed, resp.Header.Revision, sentAfter)
	case !resp.Succeeded:
		return false, l.notQueued(ctx, lk, resp.Header.Revision, reads[0], reads[1], ver)
	}
	lk.token = resp.Header.Revision
	for _, first := range reads {
		if len(first) == 0 || first[0].CreateRevision != lk.token {
			ahead = true
		}
	}
	return ahead, nil
}

// queueing is enqueue's transaction for lk, its waiter keys holding val,
// with the session's marker at version ver: it puts the waiter keys only
// while the lock floor is absent, the marker is the session's own at that
// version, and no key of the slot exists, and then reads each key's first waiter; else it
// reads the floor and the marker.
func (l *Locker) queueing(ctx context.Context, lk *Lock, val string, ver int64) clientv3.Txn {
	floorKey := etcdkeys.LockFloorKey(l.prefix)
	cmps := []clientv3.Cmp{
		clientv3.Compare(clientv3.Version(floorKey), "=", 0),
		clientv3.Compare(clientv3.Version(lk.sess.marker), "=", ver),
		// The version alone starts over when the marker is deleted and
		// put again: a late queueing would then apply after its fence.
		clientv3.Compare(clientv3.CreateRevision(lk.sess.marker), "=", lk.sess.markerRev),
	}
	ops := make([]clientv3.Op, 0, 2*len(lk.keys))
	for _, k := range lk.keys {
		w := lk.waiterKey(k)
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(w), "=", 0))
		ops = append(ops, clientv3.OpPut(w, val, clientv3.WithLease(lk.sess.id)))
	}
	for _, k := range lk.keys {
		ops = append(ops, clientv3.OpGet(etcdkeys.LockPrefix(l.prefix, l.namespace, k), clientv3.WithFirstCreate()...))
	}
	return l.cli.Txn(ctx).If(cmps...).Then(ops...).Else(clientv3.OpGet(floorKey), clientv3.OpGet(lk.sess.marker))
}

// notQueued is the error of a queueing whose comparisons failed, given
// what it read of the floor and the marker: nothing was written.
func (l *Locker) notQueued(ctx context.Context, lk *Lock, rev int64, floor, marker []*mvccpb.KeyValue, ver int64) error {
	switch {
	case len(floor) > 0:
		lk.sess.give(lk.slot)
		return fmt.Errorf("%w (etcd's revision %d, floor %s; see docs/operations.md)", ErrEtcdRegressed, rev, floor[0].Value)
	case len(marker) == 0 || marker[0].CreateRevision != lk.sess.markerRev:
		// The marker goes with the session's lease (revoked or expired),
		// or was deleted by another holder of the namespace's identity.
		lk.sess.give(lk.slot)
		l.markerLost(lk.sess)
		return fmt.Errorf("fence: queueing for %q: %w", lk.keys, context.Cause(lk.sess.ctx))
	case marker[0].Version < ver:
		// Under one creation a key's version only grows: etcd went back
		// (restored from an older snapshot within the lease's TTL). No
		// queueing would ever match again; a new session starts over.
		lk.sess.give(lk.slot)
		l.endSession(lk.sess, fmt.Errorf("%w: the session's marker %s is at version %d, below version %d read before (etcd restored from an older snapshot?); see docs/operations.md",
			ErrEtcdRegressed, lk.sess.marker, marker[0].Version, ver))
		return fmt.Errorf("fence: queueing for %q: %w", lk.keys, context.Cause(lk.sess.ctx))
	case marker[0].Version != ver:
		lk.sess.give(lk.slot)
		lk.sess.markerSeen(marker[0].Version)
		return errMarkerMoved
	}
	// A key of this slot exists, which retire's fence should have made
	// impossible. Nobody owns it: delete it; the caller queues again.
	l.abandon(ctx, &Lock{locker: l, sess: lk.sess, keys: lk.keys, waiter: lk.waiter, slot: lk.slot})
	return errNameTaken
}

// enqueueReads checks the answer to enqueue's transaction for n keys and
// returns its reads: each key's first waiter's when it succeeded (after
// its n puts), the floor key's and the marker's when it did not.
func enqueueReads(resp *clientv3.TxnResponse, n int) ([][]*mvccpb.KeyValue, error) {
	if !resp.Succeeded {
		return etcdreply.Reads(resp, 2, 0)
	}
	return etcdreply.Reads(resp, 2*n, n)
}
