package fence

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fencer-io/fencer/internal/etcdreply"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
)

// A Lock is one held acquisition of a set of keys, from Locker.Lock. Its
// tokens fence writes made under it (NewTxn, Compare); its Context ends
// the moment it is lost; Unlock ends it.
type Lock struct {
	locker *Locker
	sess   *lockSession
	keys   []string
	waiter string
	slot   uint64
	token  int64
	queued time.Time
	since  time.Time
	// gone, for a retired acquisition, ends its entry in the Locker's
	// deletions once its keys are cleared.
	gone chan struct{}

	ctx    context.Context
	cancel context.CancelCauseFunc

	mu       sync.Mutex
	watching bool
	unlocked bool
	// unlockErr is the first Unlock's result, which a repeated one returns.
	unlockErr error
}

// errUnlocked ends a Lock's context when its holder unlocks it.
var errUnlocked = errors.New("fence: the lock was unlocked")

// LockToken is a keyed lock's fencing token: the etcd revision at which
// its acquisition queued. It is strictly greater than every earlier
// holder's token of the same key, and never reused. Pass it to NewTxn or
// Compare with the Locker's prefix and namespace.
type LockToken struct {
	// Key is the lock's key.
	Key string
	// Value is the token.
	Value int64
	// Waiter names the acquisition's waiter key.
	Waiter string
}

// etcdFence is a keyed lock's fence. A waiter's key exists, with its
// revision, while it still queues, so the fence also compares the whole
// lock's range: no waiter older than the token remains. Together they hold
// exactly while this acquisition holds the lock.
func (t LockToken) etcdFence(prefix, namespace string) (fenceCheck, error) {
	if t.Value <= 0 {
		return fenceCheck{}, fmt.Errorf("lock %q token %d: %w", t.Key, t.Value, ErrNoToken)
	}
	if err := etcdkeys.ValidLockKey(t.Key); err != nil {
		return fenceCheck{}, fmt.Errorf("fence: %w", err)
	}
	if namespace == "" {
		return fenceCheck{}, fmt.Errorf("%w: a lock token's fence needs the namespace whose lock it is", ErrMisconfigured)
	}
	prefix = etcdkeys.OrDefault(prefix)
	if err := etcdkeys.CheckPrefix(prefix); err != nil {
		return fenceCheck{}, fmt.Errorf("%w: %w", ErrMisconfigured, err)
	}
	lockPrefix := etcdkeys.LockPrefix(prefix, namespace, t.Key)
	return fenceCheck{
		key: lockPrefix, offered: t.Value,
		cmps: []clientv3.Cmp{
			clientv3.Compare(clientv3.CreateRevision(etcdkeys.LockWaiterKey(prefix, namespace, t.Key, t.Waiter)), "=", t.Value),
			clientv3.Compare(clientv3.CreateRevision(lockPrefix), ">", t.Value-1).WithPrefix(),
		},
		reads: []clientv3.Op{clientv3.OpGet(lockPrefix, clientv3.WithFirstCreate()...)},
		current: func(reads [][]*mvccpb.KeyValue) int64 {
			if len(reads[0]) > 0 {
				return reads[0][0].CreateRevision
			}
			return 0
		},
	}, nil
}

// Token is the fencing token of key, one of the keys locked; every key of
// a set has the same value, that of the one transaction that queued them.
// For a key the Lock did not take it is the zero token, which every fence
// refuses (ErrNoToken): in etcd the set's value would be refused anyway
// (the key has no waiter of this Lock), but a database guard sees only the
// number, and would take it as the token of a lock this caller never held.
func (lk *Lock) Token(key string) LockToken {
	if !slices.Contains(lk.keys, key) {
		return LockToken{Key: key}
	}
	return LockToken{Key: key, Value: lk.token, Waiter: lk.waiter}
}

// Tokens are the tokens of every key locked, in the order Lock named them.
func (lk *Lock) Tokens() []LockToken {
	out := make([]LockToken, len(lk.keys))
	for i, k := range lk.keys {
		out[i] = lk.Token(k)
	}
	return out
}

// Context ends, with a cause wrapping ErrLockLost, the moment the lock is
// lost: no keepalive of the session succeeded for a whole TTL (measured from
// the last one sent, so never after etcd's own expiry), the session's lease
// was revoked or expired, or a waiter key was deleted. It also ends at
// Unlock. The first call starts a watch on the waiter keys; a holder that
// never asks is told of a session's loss only, and its fenced writes are
// refused all the same.
func (lk *Lock) Context() context.Context {
	lk.mu.Lock()
	defer lk.mu.Unlock()
	if !lk.watching && !lk.unlocked {
		lk.watching = true
		for _, k := range lk.keys {
			key := lk.waiterKey(k)
			go func() {
				if err := WatchHeld(lk.ctx, lk.locker.cli, key, lk.token, lk.token); errors.Is(err, ErrLeaseLost) {
					lk.cancel(fmt.Errorf("%w: %w", ErrLockLost, err))
				}
			}()
		}
	}
	return lk.ctx
}

// Done is Context().Done().
func (lk *Lock) Done() <-chan struct{} { return lk.Context().Done() }

// Unlock ends the lock: its Context first, then its waiter keys are
// deleted, in one round trip bounded by the Locker's Timeout. The keys'
// names are this acquisition's alone. A retried or duplicated
// Unlock does nothing more; one of a lock already lost deletes none of
// another holder's keys and returns an error wrapping ErrLockLost, since
// what was done under it may not have been protected, also when etcd does
// not answer it. When etcd does not answer, the keys are deleted
// in the background once it does, or go with the session.
func (lk *Lock) Unlock(ctx context.Context) error {
	lk.mu.Lock()
	defer lk.mu.Unlock()
	if lk.unlocked {
		return lk.unlockErr
	}
	lk.unlocked = true
	lk.unlockErr = lk.unlock(ctx)
	return lk.unlockErr
}

func (lk *Lock) unlock(ctx context.Context) error {
	lost := context.Cause(lk.ctx)
	if !errors.Is(lost, ErrLockLost) {
		lost = nil
	}
	lk.cancel(errUnlocked)
	lockMetrics.hold.Observe(time.Since(lk.since).Seconds())

	l := lk.locker
	tctx, cancel := context.WithTimeout(ctx, l.opts.Timeout)
	defer cancel()
	deleted, err := l.deleteWaitersCtx(tctx, lk)
	if err != nil {
		l.deleteInBackground(lk, make(chan struct{}))
		err = l.unavailable(tctx, err)
		if lost != nil {
			// Lost before Unlock, whatever etcd answers now: the caller
			// must hear that, not only that etcd is away.
			return fmt.Errorf("fence: unlocking %q: the lock was lost before Unlock: %w; its keys are deleted in the background: %w", lk.keys, lost, err)
		}
		return fmt.Errorf("fence: unlocking %q: %w", lk.keys, err)
	}
	for i, ok := range deleted {
		if !ok {
			if lost == nil {
				lost = errors.New("its waiter key was gone")
			}
			return fmt.Errorf("%w: %q under token %d was no longer held at Unlock (%w); only this acquisition's own waiter keys were deleted, none of another holder's", ErrLockLost, lk.keys[i], lk.token, lost)
		}
	}
	if lost != nil {
		// Its context ended before etcd expired its keys: what was done
		// under it after that may not have been protected.
		return fmt.Errorf("fence: unlocking %q: the lock was lost before Unlock: %w", lk.keys, lost)
	}
	return nil
}

// begin makes lk held from now: its context derives from the session's, so
// a lost session ends it, and a loss is counted.
func (lk *Lock) begin() {
	lk.since = time.Now()
	lk.ctx, lk.cancel = context.WithCancelCause(lk.sess.ctx)
	context.AfterFunc(lk.ctx, func() {
		if !errors.Is(context.Cause(lk.ctx), errUnlocked) {
			lockMetrics.lost.Inc()
		}
	})
}

func (lk *Lock) waiterKey(key string) string {
	return etcdkeys.LockWaiterKey(lk.locker.prefix, lk.locker.namespace, key, lk.waiter)
}

// waitTurn waits, key by key, until no waiter older than lk remains. Each
// wait watches only the newest older waiter, so a release wakes one
// waiter, not all. The check of what is ahead runs only while lk's own
// waiter key is still there: a session lost meanwhile is not taken for
// a turn.
func (l *Locker) waitTurn(ctx context.Context, lk *Lock) error {
	for _, k := range lk.keys {
		prefix := etcdkeys.LockPrefix(l.prefix, l.namespace, k)
		own := lk.waiterKey(k)
		for {
			if err := lk.sess.ctx.Err(); err != nil {
				return context.Cause(lk.sess.ctx)
			}
			tctx, cancel := context.WithTimeout(ctx, l.opts.Timeout)
			resp, err := l.cli.Txn(tctx).
				If(clientv3.Compare(clientv3.CreateRevision(own), "=", lk.token)).
				Then(clientv3.OpGet(prefix, append(clientv3.WithLastCreate(), clientv3.WithMaxCreateRev(lk.token-1))...)).
				Commit()
			cancel()
			switch {
			case err != nil && ctx.Err() != nil:
				return ctx.Err()
			case err != nil:
				return fmt.Errorf("fence: waiting for %q: %w", k, l.unavailable(tctx, err))
			case !resp.Succeeded:
				return fmt.Errorf("%w: the waiter key for %q was deleted while it queued", ErrLockLost, k)
			}
			reads, err := etcdreply.Reads(resp, 1, 0)
			if err != nil {
				return fmt.Errorf("fence: waiting for %q: %w", k, err)
			}
			ahead := reads[0] // the waiter before this one, if any
			if len(ahead) == 0 {
				break
			}
			if err := waitDeleted(ctx, lk.sess.ctx, l.cli, string(ahead[0].Key), ahead[0].CreateRevision, resp.Header.Revision); err != nil {
				return err
			}
		}
	}
	return nil
}

// waitDeleted returns once key no longer holds the waiter created at
// createRev (WatchHeld), or with the cause of sess or ctx ending.
func waitDeleted(ctx, sess context.Context, cli *clientv3.Client, key string, createRev, fromRev int64) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(sess, cancel)
	defer stop()
	err := WatchHeld(wctx, cli, key, createRev, fromRev)
	switch {
	case errors.Is(err, ErrLeaseLost):
		return nil // the waiter ahead is gone
	case sess.Err() != nil:
		return context.Cause(sess)
	case ctx.Err() != nil:
		return ctx.Err()
	}
	return err
}

// abandon deletes the waiter keys of lk, which never held, and returns
// once the first attempt is over (it is bounded by the Locker's Timeout) or
// ctx has ended, whichever comes first. A caller whose ctx has ended is not
// kept waiting for etcd: the deletion goes on in the background, retried
// until etcd answers or the session ends, and the Locker's next Lock of
// these keys waits for it instead (deletions).
func (l *Locker) abandon(ctx context.Context, lk *Lock) {
	tried := make(chan struct{})
	l.deleteInBackground(lk, tried)
	select {
	case <-tried:
	case <-ctx.Done():
	}
}

// deleteInBackground deletes lk's waiter keys, retried until etcd answers
// or the session ends; tried closes after the first attempt. Until the
// keys are gone, the Locker's own Locks of them wait (deletions).
func (l *Locker) deleteInBackground(lk *Lock, tried chan struct{}) {
	gone := l.deletions.begin(lk.keys)
	go func() {
		defer l.deletions.end(lk.keys, gone)
		err := l.deleteWaiters(lk)
		close(tried)
		if err != nil {
			l.retryDelete(lk)
		}
	}()
}

// deleteWaiters deletes lk's waiter keys, bounded by the Locker's Timeout.
func (l *Locker) deleteWaiters(lk *Lock) error {
	ctx, cancel := context.WithTimeout(l.ctx, l.opts.Timeout)
	defer cancel()
	_, err := l.deleteWaitersCtx(ctx, lk)
	return err
}

// deleteWaitersCtx deletes lk's waiter keys, each only while it has lk's
// revision, in one round trip, and reports for each whether it was there
// to delete. Once they are gone the slot goes back to the session. An
// acquisition whose queueing failed has no known revision: its keys are
// read first and deleted at the revision they have (clearWaiters), and
// nothing is reported.
func (l *Locker) deleteWaitersCtx(ctx context.Context, lk *Lock) ([]bool, error) {
	if lk.token == 0 {
		if err := l.clearWaiters(ctx, []*Lock{lk}); err != nil {
			return nil, err
		}
		lk.sess.give(lk.slot)
		return nil, nil
	}
	out := make([]bool, len(lk.keys))
	if len(lk.keys) == 1 {
		// One key, the common case: one flat comparison and delete, with
		// less for etcd to decode and run than a transaction nested in one.
		w := lk.waiterKey(lk.keys[0])
		resp, err := l.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(w), "=", lk.token)).Then(clientv3.OpDelete(w)).Commit()
		if err != nil {
			return nil, err
		}
		if out[0], err = etcdreply.Deleted(resp); err != nil {
			return nil, err
		}
	} else {
		ops := make([]clientv3.Op, len(lk.keys))
		for i, k := range lk.keys {
			w := lk.waiterKey(k)
			ops[i] = atRevision(w, lk.token, clientv3.OpDelete(w))
		}
		resp, err := l.cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return nil, err
		}
		if err := etcdreply.Txn(resp, len(ops)); err != nil {
			return nil, err
		}
		for i := range lk.keys {
			if out[i], err = etcdreply.Succeeded(resp, i); err != nil {
				return nil, err
			}
		}
	}
	lk.sess.give(lk.slot)
	return out, nil
}

// retryDelete deletes lk's waiter keys once etcd answers again, or stops
// when the session ends, taking them with it (untilDone).
func (l *Locker) retryDelete(lk *Lock) {
	l.untilDone(lk.sess, fmt.Sprintf("deleting the waiter keys of %q", lk.keys), func(ctx context.Context) error {
		_, err := l.deleteWaitersCtx(ctx, lk)
		return err
	})
}

// unreachable reports whether an etcd call failed because etcd did not
// answer: it timed out, could not be reached, or has no leader. clientv3
// turns etcd's own errors (no leader, request timed out) into
// rpctypes.EtcdError, which carries its gRPC code but no gRPC status.
func unreachable(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	switch etcdCode(err) {
	case codes.Unavailable, codes.DeadlineExceeded:
		return true
	}
	return false
}

// etcdCode is the gRPC code of an etcd call's error, whether it came as a
// gRPC status or as clientv3's rpctypes.EtcdError.
func etcdCode(err error) codes.Code {
	if etcdErr := (rpctypes.EtcdError{}); errors.As(err, &etcdErr) {
		return etcdErr.Code()
	}
	return status.Code(err)
}

// transient reports whether an etcd call may succeed if tried again:
// etcd did not answer, or asked to slow down.
func transient(err error) bool {
	return unreachable(err) || etcdCode(err) == codes.ResourceExhausted
}

// atRevision is op, run only while key's CreateRevision is rev: an
// acquisition's own key, never a later one under the same name.
func atRevision(key string, rev int64, op clientv3.Op) clientv3.Op {
	return clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", rev)}, []clientv3.Op{op}, nil)
}

// markHeld records in a waiter's keys when it became holder, for `kubectl
// fencer locks`; only while each key still has its revision, and off the
// lock's path: Lock has already returned.
func (l *Locker) markHeld(lk *Lock) {
	now := time.Now().UTC()
	val, _ := json.Marshal(LockHolder{Pod: l.opts.Pod, PodUID: l.opts.PodUID, Queued: lk.queued, Held: &now})
	ops := make([]clientv3.Op, len(lk.keys))
	for i, k := range lk.keys {
		w := lk.waiterKey(k)
		ops[i] = atRevision(w, lk.token, clientv3.OpPut(w, string(val), clientv3.WithLease(lk.sess.id)))
	}
	ctx, cancel := context.WithTimeout(l.ctx, l.opts.Timeout)
	defer cancel()
	_, _ = l.cli.Txn(ctx).Then(ops...).Commit()
}
