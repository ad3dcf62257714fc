package fence

import (
	"context"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"

	"github.com/fencer-io/fencer/internal/etcdreply"
)

// retire handles a queueing whose outcome is unknown: its caller gave up,
// or the call failed, before etcd answered. The transaction may yet reach
// etcd and apply (held in a network path, or in etcd's raft log), leaving
// waiter keys that nobody owns ahead of everyone on their locks, and etcd
// states no moment after which it no longer can.
//
// So the session's queueings are fenced off: its marker key is put again,
// and every queueing compares the marker's version (Locker.queueing). Once
// etcd has answered that put, no queueing sent before it can apply. Then
// the retired acquisition's keys are read and deleted once, and its slot
// is free again. Both are retried until they succeed or the session ends
// (its lease then takes the keys); meanwhile the Locker's next Lock of
// these keys waits for them (deletions).
//
// The session's other queueings in flight at a fence fail its comparison
// and queue again with the new version. So one fence covers every
// retirement since the last, and a fence begins at most every fenceEvery: a
// slow etcd, on which many Locks give up mid-queueing, does not fail the
// rest over and over.
func (l *Locker) retire(lk *Lock) {
	lk.gone = l.deletions.begin(lk.keys)
	sess := lk.sess
	sess.mu.Lock()
	defer sess.mu.Unlock()
	sess.retired = append(sess.retired, lk)
	if !sess.fencing {
		sess.fencing = true
		go l.fenceOff(sess)
	}
}

// fenceEvery is the least time between two fences of a session's
// queueings: a second, or half the Timeout if that is less, so that the
// Locker's own next Lock of a retired key, which waits for its deletion
// up to the Timeout, does not wait in vain.
func (l *Locker) fenceEvery() time.Duration {
	return min(time.Second, l.opts.Timeout/2)
}

// fenceOff fences the session's queueings off and deletes the retired
// acquisitions' keys, round after round, until none is left or the session
// ends. One runs at a time per session.
func (l *Locker) fenceOff(sess *lockSession) {
	var last time.Time
	for {
		if wait := time.Until(last.Add(l.fenceEvery())); wait > 0 {
			select {
			case <-sess.ctx.Done():
			case <-time.After(wait):
			}
		}
		sess.mu.Lock()
		round := sess.retired
		sess.retired = nil
		if len(round) == 0 || sess.ctx.Err() != nil {
			sess.fencing = false
			sess.mu.Unlock()
			for _, lk := range round { // the session's lease takes their keys
				l.deletions.end(lk.keys, lk.gone)
			}
			return
		}
		sess.mu.Unlock()
		last = time.Now()
		l.untilDone(sess, "fencing off the session's queueings", func(ctx context.Context) error {
			return l.fenceQueueings(ctx, sess)
		})
		for _, batch := range clearBatches(round) {
			l.untilDone(sess, "clearing the waiter keys of queueings whose outcome was unknown", func(ctx context.Context) error {
				return l.clearWaiters(ctx, batch)
			})
			for _, lk := range batch {
				if sess.ctx.Err() == nil {
					sess.give(lk.slot) // its keys are gone, and cannot come back
				}
				l.deletions.end(lk.keys, lk.gone)
			}
		}
	}
}

// clearBatches splits retired acquisitions into batches of at most
// clearBatch waiter keys (one acquisition may hold fewer than 64: more
// would not have been queued), so that a round of many is cleared in a
// few transactions, not one after another.
func clearBatches(round []*Lock) [][]*Lock {
	var out [][]*Lock
	n := 0
	for _, lk := range round {
		if len(out) == 0 || n+len(lk.keys) > clearBatch {
			out = append(out, nil)
			n = 0
		}
		out[len(out)-1] = append(out[len(out)-1], lk)
		n += len(lk.keys)
	}
	return out
}

// clearBatch is how many waiter keys one clearing reads: under etcd's
// default limit of 128 operations per transaction.
const clearBatch = 64

// clearWaiters reads the waiter keys of lks and deletes those that exist,
// each at the revision it has: one read, and one transaction of deletes.
func (l *Locker) clearWaiters(ctx context.Context, lks []*Lock) error {
	var keys []string
	for _, lk := range lks {
		for _, k := range lk.keys {
			keys = append(keys, lk.waiterKey(k))
		}
	}
	gets := make([]clientv3.Op, len(keys))
	for i, k := range keys {
		gets[i] = clientv3.OpGet(k)
	}
	resp, err := l.cli.Txn(ctx).Then(gets...).Commit()
	if err != nil {
		return err
	}
	reads, err := etcdreply.Reads(resp, len(gets), 0)
	if err != nil {
		return err
	}
	var dels []clientv3.Op
	for i, kvs := range reads {
		if len(kvs) > 0 {
			dels = append(dels, atRevision(keys[i], kvs[0].CreateRevision, clientv3.OpDelete(keys[i])))
		}
	}
	if len(dels) == 0 {
		return nil
	}
	del, err := l.cli.Txn(ctx).Then(dels...).Commit()
	if err != nil {
		return err
	}
	return etcdreply.Txn(del, len(dels))
}

// fenceQueueings puts sess's marker key again, raising its version: no
// queueing that compared an older version can apply once this returns nil.
// Only the marker the session created is put again: one deleted meanwhile
// (its version would start over, and let old queueings through) ends the
// session instead, and its lease with it.
func (l *Locker) fenceQueueings(ctx context.Context, sess *lockSession) error {
	resp, err := l.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(sess.marker), "=", sess.markerRev)).
		Then(clientv3.OpPut(sess.marker, sess.markerVal, clientv3.WithLease(sess.id)), clientv3.OpGet(sess.marker)).
		Commit()
	if err != nil {
		return err
	}
	if !resp.Succeeded {
		if err := etcdreply.Txn(resp, 0); err != nil {
			return err
		}
		l.markerLost(sess)
		return fmt.Errorf("fence: %w", context.Cause(sess.ctx))
	}
	reads, err := etcdreply.Reads(resp, 2, 1)
	if err != nil {
		return err
	}
	if len(reads[0]) == 0 {
		return fmt.Errorf("%w: the marker key %s read back absent right after its put", etcdreply.ErrMalformed, sess.marker)
	}
	sess.markerSeen(reads[0][0].Version)
	return nil
}

// markerLost ends sess, whose marker key is gone: with its lease (revoked
// or expired), or deleted by another holder of the namespace's identity.
// Its lease is revoked, if it still lives, so that no queueing of the
// session can apply after this; the next Lock starts another session.
func (l *Locker) markerLost(sess *lockSession) {
	l.endSession(sess, fmt.Errorf("its marker key %s is gone, or was put again by another", sess.marker))
}

// endSession ends sess for cause, its held locks with it, and revokes its
// lease: the next Lock starts a session of its own.
func (l *Locker) endSession(sess *lockSession, cause error) {
	sess.lose(cause)
	go l.revoke(sess.id)
}

// markerSeen records a version of the session's marker: queueings compare
// the highest seen.
func (s *lockSession) markerSeen(v int64) {
	for {
		top := s.markerVer.Load()
		if v <= top || s.markerVer.CompareAndSwap(top, v) {
			return
		}
	}
}

// untilDone runs op, each time bounded by the Timeout, until it succeeds
// or the session ends, trying at least every second so that a Lock
// waiting for it (deletions) is not kept past etcd's return by a long
// back-off. A refusal (an error that is not transient) ends the session:
// what op leaves undone would otherwise stand for as long as the session
// lives, and the session's lease takes it all.
func (l *Locker) untilDone(sess *lockSession, what string, op func(context.Context) error) {
	for wait := 100 * time.Millisecond; sess.ctx.Err() == nil; wait = min(2*wait, time.Second) {
		ctx, cancel := context.WithTimeout(l.ctx, l.opts.Timeout)
		err := op(ctx)
		cancel()
		if err == nil {
			return
		}
		if !transient(err) && !errors.Is(err, etcdreply.ErrMalformed) {
			sess.lose(fmt.Errorf("%s: %w", what, err))
			l.revoke(sess.id)
			return
		}
		select {
		case <-sess.ctx.Done():
		case <-time.After(wait):
		}
	}
}

// refused reports whether etcd answered a request with a refusal, which
// it never applies: a bad request, a failed precondition or permission, a
// lease not found. Everything else, a call that did not complete or an
// answer that cannot be read, leaves the outcome unknown.
func refused(err error) bool {
	switch etcdCode(err) {
	case codes.InvalidArgument, codes.FailedPrecondition, codes.PermissionDenied,
		codes.Unauthenticated, codes.OutOfRange, codes.NotFound, codes.AlreadyExists:
		return true
	}
	return false
}
