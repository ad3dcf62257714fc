package fence

import (
	"context"
	"slices"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"

	"github.com/fencer-io/fencer/internal/etcdreply"
)

// A queueing whose outcome is unknown (its caller gave up, or the call
// failed, before etcd answered) may still apply afterwards, and leave
// waiter keys that nobody owns ahead of everyone on their locks. Such an
// acquisition is retired: its slot is never used again, and its keys are
// deleted whenever they appear.
//
// etcd states no moment after which such a transaction can no longer
// apply. In practice it applies within moments or not at all: a request
// etcd took is committed or dropped within about an election once the
// cluster has a leader, and the session's keepalives, which need one, have
// gone on all along (else the session is lost, and its lease takes the
// keys). So each key is watched for sweepWatchFor, deleted the moment it
// appears; then it joins the session's retired list, which one goroutine
// reads in batches every sweepPollEvery, for sweepKeepFor more. A process
// whose Locks keep giving up mid-queueing (short deadlines against a slow
// etcd) holds a watch only for the keys it retired in the last
// sweepWatchFor, and reads only those of the last sweepKeepFor.

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
// longer than the session takes to send a keepalive.
func (l *Locker) sweepPollEvery() time.Duration {
	if l.sweepPoll > 0 {
		return l.sweepPoll
	}
	return l.opts.TTL / 3
}

// sweepKeepFor is how long a retired key stays on the list after its
// watch: ten minutes, dozens of elections' worth, so that the reads stop
// growing with the retirements of a long-lived session.
func (l *Locker) sweepKeepFor() time.Duration {
	if l.sweepKeep > 0 {
		return l.sweepKeep
	}
	return 10 * time.Minute
}

// retire handles a queueing whose outcome is unknown (see above). The
// Locker's next Lock of its keys waits for the first read and deletion of
// each (deletions): the queueing most often applied just before its
// caller gave up.
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

// sweep deletes key if it exists, reading it until a read succeeds or the
// session ends, and then runs swept. Then it watches key for
// sweepWatchFor, deleting it whenever it appears, and hands it to the
// session's poller.
func (l *Locker) sweep(sess *lockSession, key string, swept func()) {
	readAt, ok := l.deleteNow(sess.ctx, key)
	swept()
	if !ok {
		return // the session ended, and its lease takes the key
	}
	ctx, cancel := context.WithTimeout(sess.ctx, l.sweepWatchFor())
	defer cancel()
	l.watchAndDelete(ctx, key, readAt+1)
	if sess.ctx.Err() == nil && sess.addRetired(key) {
		go l.pollRetired(sess)
	}
}

// deleteNow reads key and deletes it at the revision it has, trying again
// every second until that succeeds, and returns the read's revision; false
// if ctx ended first.
func (l *Locker) deleteNow(ctx context.Context, key string) (int64, bool) {
	for ctx.Err() == nil {
		readAt, err := l.readAndDelete(ctx, key)
		if err == nil {
			return readAt, true
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
	return 0, false
}

// readAndDelete reads key, deletes it at the revision it has if it exists,
// and returns the read's revision.
func (l *Locker) readAndDelete(ctx context.Context, key string) (int64, error) {
	gctx, cancel := context.WithTimeout(ctx, l.opts.Timeout)
	resp, err := l.cli.Get(gctx, key)
	cancel()
	if err != nil {
		return 0, err
	}
	readAt, err := etcdreply.Revision(resp.Header)
	if err == nil && len(resp.Kvs) > 0 {
		err = l.deleteAt(ctx, key, resp.Kvs[0].CreateRevision)
	}
	return readAt, err
}

// watchAndDelete deletes key whenever it is put, from revision from on,
// until ctx ends. After a watch or a delete that failed, it reads key
// again, since the watch sees only later puts.
func (l *Locker) watchAndDelete(ctx context.Context, key string, from int64) {
	for ctx.Err() == nil {
		l.deleteOnPut(ctx, key, from)
		readAt, ok := l.deleteNow(ctx, key)
		if !ok {
			return
		}
		from = readAt + 1
	}
}

// deleteOnPut deletes key each time it is put, from revision from on, and
// returns when ctx ends, the watch fails, or a delete does.
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
// sweepPollEvery, until the session ends or its list is empty. One runs
// at a time per session.
func (l *Locker) pollRetired(sess *lockSession) {
	tick := time.NewTicker(l.sweepPollEvery())
	defer tick.Stop()
	for {
		select {
		case <-sess.ctx.Done():
			return
		case <-tick.C:
		}
		keys := sess.retiredSince(time.Now().Add(-l.sweepKeepFor()))
		if keys == nil {
			return
		}
		for batch := range slices.Chunk(keys, sweepBatch) {
			l.deleteExisting(sess.ctx, batch)
		}
	}
}

// deleteExisting deletes those of keys that exist, each at the revision it
// has: one read of them all, and one transaction for those found. A call
// that fails is left to the next poll.
func (l *Locker) deleteExisting(ctx context.Context, keys []retiredKey) {
	ctx, cancel := context.WithTimeout(ctx, l.opts.Timeout)
	defer cancel()
	gets := make([]clientv3.Op, len(keys))
	for i, k := range keys {
		gets[i] = clientv3.OpGet(k.key)
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
			k := keys[i].key
			dels = append(dels, atRevision(k, kvs[0].CreateRevision, clientv3.OpDelete(k)))
		}
	}
	if len(dels) > 0 {
		_, _ = l.cli.Txn(ctx).Then(dels...).Commit()
	}
}

// retiredKey is a waiter key on a session's retired list, since when.
type retiredKey struct {
	key   string
	since time.Time
}

// addRetired adds a key past its watch to the session's retired list, and
// reports whether no poller runs, so its caller starts one.
func (s *lockSession) addRetired(key string) (start bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.retired = append(s.retired, retiredKey{key: key, since: time.Now()})
	start = !s.polling
	s.polling = true
	return start
}

// retiredSince drops the keys retired before cutoff and returns the rest,
// oldest first; nil when none is left, and then the poller stops (the next
// addRetired starts another). The list only grows at its end, so the
// slice returned never changes under its reader.
func (s *lockSession) retiredSince(cutoff time.Time) []retiredKey {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := 0
	for old < len(s.retired) && s.retired[old].since.Before(cutoff) {
		old++
	}
	if old > 0 {
		s.retired = slices.Clone(s.retired[old:]) // lets the dropped keys go
	}
	if len(s.retired) == 0 {
		s.polling = false
		return nil
	}
	return slices.Clip(s.retired)
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
