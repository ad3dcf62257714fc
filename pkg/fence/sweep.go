package fence

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-io/fencer/internal/etcdreply"
)

// A queueing whose outcome is unknown (its transaction failed, or its
// caller gave up, before etcd answered) may still apply afterwards, and
// leave waiter keys that nobody owns ahead of everyone on their locks.
// etcd names no moment after which such a transaction can no longer apply:
// only the end of the session's lease ends it (a put under a lease that is
// gone fails, and the lease takes its keys with it). So a retired
// acquisition's keys are deleted whenever they appear, until the session
// ends.
//
// A late apply comes soon after the caller gave up, if at all, so each key
// is watched at first and deleted the moment it appears. After
// sweepWatchFor it joins the session's retired list, which one goroutine
// reads in batches every sweepPollEvery. A process whose Locks keep giving
// up mid-queueing (short deadlines against a slow etcd) thus holds a watch
// only for the keys it retired in the last sweepWatchFor, not one for each
// key it retired since its session began.

// sweepBatch is how many retired keys one read checks: under etcd's
// default limit of 128 operations per transaction.
const sweepBatch = 64

// sweepWatchFor is how long a retired key is watched before it is only
// polled: twice the Timeout, by which a request etcd took before its
// caller gave up has long been applied, in a cluster that answers at all.
func (l *Locker) sweepWatchFor() time.Duration {
	if l.sweepWatch > 0 {
		return l.sweepWatch
	}
	return 2 * l.opts.Timeout
}

// sweepPollEvery is how often the retired list is read: every keepalive
// interval (TTL/3), so a key that appears late blocks its lock for no
// longer than the session takes to notice a lost keepalive.
func (l *Locker) sweepPollEvery() time.Duration {
	if l.sweepPoll > 0 {
		return l.sweepPoll
	}
	return l.opts.TTL / 3
}

// retire handles a queueing whose outcome is unknown. Its slot is never
// used again, and each of its keys is deleted now if it is there, and
// whenever it appears until the session ends. The Locker's next Lock of
// these keys waits for the first of those deletions (deletions): the
// queueing most often applied just before its caller gave up.
func (l *Locker) retire(lk *Lock) {
	gone := l.deletions.begin(lk.keys)
	var left atomic.Int32
	left.Store(int32(len(lk.keys)))
	for _, k := range lk.keys {
		go l.sweep(lk.sess, lk.waiterKey(k), func() {
			if left.Add(-1) == 0 {
				l.deletions.end(lk.keys, gone)
			}
		})
	}
}

// sweep watches key for sweepWatchFor, deleting it whenever it exists,
// then hands it to the session's poller. swept runs once, after the first
// read of key and its deletion, or when the watch ends before that.
func (l *Locker) sweep(sess *lockSession, key string, swept func()) {
	swept = sync.OnceFunc(swept)
	defer swept()
	ctx, cancel := context.WithTimeout(sess.ctx, l.sweepWatchFor())
	defer cancel()
	l.watchAndDelete(ctx, key, swept)
	if sess.ctx.Err() == nil && sess.addRetired(key) {
		go l.pollRetired(sess)
	}
}

// watchAndDelete deletes key (at the revision it has) whenever it exists,
// until ctx ends; swept runs after each read of key and its deletion.
func (l *Locker) watchAndDelete(ctx context.Context, key string, swept func()) {
	for ctx.Err() == nil {
		gctx, cancel := context.WithTimeout(ctx, l.opts.Timeout)
		resp, err := l.cli.Get(gctx, key)
		cancel()
		var readAt int64
		if err == nil {
			readAt, err = etcdreply.Revision(resp.Header)
		}
		if err == nil && len(resp.Kvs) > 0 {
			err = l.deleteAt(ctx, key, resp.Kvs[0].CreateRevision)
		}
		if err != nil { // read again: the watch sees only later puts
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		swept()
		l.deleteOnPut(ctx, key, readAt+1)
	}
}

// deleteOnPut deletes key each time it is put, from revision from on, and
// returns when ctx ends, the watch fails, or a delete does: the caller then
// reads key again.
func (l *Locker) deleteOnPut(ctx context.Context, key string, from int64) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel() // ends the watch
	for wr := range l.cli.Watch(wctx, key, clientv3.WithRev(from), clientv3.WithFilterDelete()) {
		if wr.Err() != nil || wr.CompactRevision != 0 {
			return
		}
		for _, ev := range wr.Events {
			if l.deleteAt(ctx, key, ev.Kv.CreateRevision) != nil {
				return
			}
		}
	}
}

// deleteAt deletes key while its CreateRevision is rev.
func (l *Locker) deleteAt(ctx context.Context, key string, rev int64) error {
	dctx, cancel := context.WithTimeout(ctx, l.opts.Timeout)
	defer cancel()
	_, err := l.cli.Txn(dctx).Then(atRevision(key, rev, clientv3.OpDelete(key))).Commit()
	return err
}

// pollRetired deletes the session's retired keys that exist, every
// sweepPollEvery, until the session ends. One runs per session.
func (l *Locker) pollRetired(sess *lockSession) {
	tick := time.NewTicker(l.sweepPollEvery())
	defer tick.Stop()
	for {
		select {
		case <-sess.ctx.Done():
			return
		case <-tick.C:
		}
		for batch := range slices.Chunk(sess.retiredKeys(), sweepBatch) {
			l.deleteExisting(sess.ctx, batch)
		}
	}
}

// deleteExisting deletes those of keys that exist, each at the revision it
// has: one read of them all, and one transaction for those found. A call
// that fails is left to the next poll.
func (l *Locker) deleteExisting(ctx context.Context, keys []string) {
	ctx, cancel := context.WithTimeout(ctx, l.opts.Timeout)
	defer cancel()
	gets := make([]clientv3.Op, len(keys))
	for i, k := range keys {
		gets[i] = clientv3.OpGet(k)
	}
	resp, err := l.cli.Txn(ctx).Then(gets...).Commit()
	if err != nil {
		return
	}
	reads, err := etcdreply.Reads(resp, len(gets), 0)
	if err != nil {
		return
	}
	var dels []clientv3.Op
	for i, kvs := range reads {
		if len(kvs) > 0 {
			dels = append(dels, atRevision(keys[i], kvs[0].CreateRevision, clientv3.OpDelete(keys[i])))
		}
	}
	if len(dels) > 0 {
		_, _ = l.cli.Txn(ctx).Then(dels...).Commit()
	}
}

// addRetired adds a key past its watch to the session's retired list, and
// reports whether it is the first, whose caller starts the poller.
func (s *lockSession) addRetired(key string) (first bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.retired = append(s.retired, key)
	return len(s.retired) == 1
}

// retiredKeys is the retired list as it stands. The list only grows, so
// the slice it returns never changes under its reader.
func (s *lockSession) retiredKeys() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clip(s.retired)
}
