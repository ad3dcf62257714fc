package fence

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// retiredSession is a Locker of namespace a through cli and its session.
func retiredSession(t *testing.T, e *lockEtcd, cli *clientv3.Client, opts LockerOptions) (*Locker, *lockSession) {
	t.Helper()
	l := e.locker(t, cli, "a", opts)
	_ = mustLock(t, l, "warm").Unlock(context.Background())
	sess, err := l.session(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return l, sess
}

// waitRetired waits until the Locker has cleared the retired keys of key.
func waitRetired(t *testing.T, l *Locker, key string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := awaitAll(ctx, l.deletions.of([]string{key})); err != nil {
		t.Fatalf("the retired keys of %s were not cleared: %v", key, err)
	}
}

// A queueing that reaches etcd after its caller gave up and it was
// retired can no longer apply: retire fenced it off by moving the
// session's marker on, so etcd refuses it however late it comes. Here it
// is sent after the retirement, as a network path that held it would.
func TestALateQueueingCannotApplyAfterItsRetirement(t *testing.T) {
	e := startLockEtcd(t)
	l, sess := retiredSession(t, e, e.client(t, "a", nil), LockerOptions{})
	lk := &Lock{locker: l, sess: sess, keys: []string{"k"}, waiter: "late-1"}
	late := l.queueing(context.Background(), lk, "{}", sess.markerVer.Load()) // sent, then held
	l.retire(lk)
	waitRetired(t, l, "k")
	resp, err := late.Commit()
	if err != nil {
		t.Fatal(err)
	}
	if resp.Succeeded {
		t.Fatal("a queueing retired before it reached etcd applied")
	}
	waitForWaiters(t, e.mgr, "a", "k", 0)
	other := mustLock(t, e.locker(t, e.client(t, "a", nil), "a", LockerOptions{}), "k")
	_ = other.Unlock(context.Background())
}

// A queueing that applied before its answer was lost is cleared: its key
// is deleted, and the Locker's own TryLock right after the retirement
// waits for that and finds the key free.
func TestARetiredQueueingThatAppliedIsCleared(t *testing.T) {
	e := startLockEtcd(t)
	l, sess := retiredSession(t, e, e.client(t, "a", nil), LockerOptions{})
	lk := &Lock{locker: l, sess: sess, keys: []string{"j"}, waiter: "late-1"}
	resp, err := l.queueing(context.Background(), lk, "{}", sess.markerVer.Load()).Commit()
	if err != nil || !resp.Succeeded {
		t.Fatalf("queueing: %v, %v", resp, err)
	}
	l.retire(lk)
	mustFindFree(t, l, "j", "right after the Locker retired a queueing of it")
	waitForWaiters(t, e.mgr, "a", "j", 0)
}

// A retirement made while etcd is silent is carried out once etcd
// answers, and the Locker's own TryLock then finds the key free.
func TestARetirementWaitsForEtcd(t *testing.T) {
	e := startLockEtcd(t)
	p := newProxy(t, strings.TrimPrefix(e.Endpoint, "https://"))
	l, sess := retiredSession(t, e, e.client(t, "a", nil, "https://"+p.l.Addr().String()), LockerOptions{TTL: 60 * time.Second, Timeout: 500 * time.Millisecond})
	lk := &Lock{locker: l, sess: sess, keys: []string{"j"}, waiter: "late-1"}
	if resp, err := l.queueing(context.Background(), lk, "{}", sess.markerVer.Load()).Commit(); err != nil || !resp.Succeeded {
		t.Fatalf("queueing: %v, %v", resp, err)
	}
	p.stall() // its answer, like everything else, is held
	l.retire(lk)
	time.Sleep(2 * time.Second)
	p.flow()
	waitForWaiters(t, e.mgr, "a", "j", 0)
	waitRetired(t, l, "j")
	mustFindFree(t, l, "j", "whose retired key is gone and which nobody holds")
}

// A queueing etcd refused outright (here, too many operations in one
// transaction) was never applied and never will be: it is not retired,
// so it fences nothing off and costs no wait for the next Lock of its keys.
func TestARefusedQueueingIsNotRetired(t *testing.T) {
	e := startLockEtcd(t)
	l, sess := retiredSession(t, e, e.client(t, "a", nil), LockerOptions{})
	keys := make([]string, 65) // 2 operations a key, over etcd's 128
	for i := range keys {
		keys[i] = fmt.Sprintf("k%d", i)
	}
	if _, err := l.Lock(context.Background(), keys...); err == nil {
		t.Fatal("etcd took a queueing of 65 keys; the test needs one it refuses")
	}
	if n := len(l.deletions.of(keys)); n != 0 {
		t.Fatalf("%d clean-ups under way for a queueing etcd refused", n)
	}
	resp, err := e.mgr.Get(context.Background(), sess.marker)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || resp.Kvs[0].Version != 1 {
		t.Fatalf("the session marker after a refused queueing: %v, want version 1 (no fence)", resp.Kvs)
	}
	mustFindFree(t, l, "k0", "whose queueing etcd refused")
}

// Retirements, each fencing off the session's queueings, while other
// goroutines of the same Locker lock and unlock: their queueings in flight
// at a fence queue again, and every Lock succeeds. It runs until three
// fences have moved the session's marker on.
func TestLocksGoOnThroughRetirements(t *testing.T) {
	e := startLockEtcd(t)
	l, sess := retiredSession(t, e, e.client(t, "a", nil), LockerOptions{})
	stop := make(chan struct{})
	var retirer sync.WaitGroup
	retirer.Go(func() {
		defer close(stop)
		deadline := time.Now().Add(30 * time.Second)
		for i := 0; time.Now().Before(deadline); i++ {
			time.Sleep(20 * time.Millisecond)
			l.retire(&Lock{locker: l, sess: sess, keys: []string{fmt.Sprintf("r%d", i)}, waiter: fmt.Sprintf("late-%d", i)})
			resp, err := e.mgr.Get(context.Background(), sess.marker)
			if err != nil {
				t.Error(err)
				return
			}
			if len(resp.Kvs) == 1 && resp.Kvs[0].Version >= 4 {
				return
			}
		}
		t.Error("three fences did not come within 30 s")
	})
	var lockers sync.WaitGroup
	for w := range 8 {
		lockers.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if !lockUnlock(t, l, fmt.Sprintf("w%d-%d", w, i%3)) {
					return
				}
			}
		})
	}
	retirer.Wait()
	lockers.Wait()
	if err := context.Cause(sess.ctx); err != nil {
		t.Fatalf("the session ended: %v", err)
	}
}

// A marker deleted by another holder of the namespace's identity would
// start its version over, and let a queueing held since before a fence
// through. The fence does not put it back: it ends the session and
// revokes its lease, so the held queueing cannot apply.
func TestADeletedMarkerEndsTheSession(t *testing.T) {
	e := startLockEtcd(t)
	cli := e.client(t, "a", nil)
	l, sess := retiredSession(t, e, cli, LockerOptions{})
	lk := &Lock{locker: l, sess: sess, keys: []string{"k"}, waiter: "late-1", slot: 1000}
	late := l.queueing(context.Background(), lk, "{}", sess.markerVer.Load()) // sent, then held
	if _, err := cli.Delete(context.Background(), sess.marker); err != nil {
		t.Fatal(err)
	}
	l.retire(lk)
	waitRetired(t, l, "k")
	if resp, err := late.Commit(); err == nil && resp.Succeeded {
		t.Fatal("a queueing held since before its fence applied after the marker was deleted")
	}
	if err := context.Cause(sess.ctx); !errors.Is(err, ErrLockLost) {
		t.Fatalf("the session after its marker was deleted: %v, want it lost", err)
	}
	waitForWaiters(t, e.mgr, "a", "k", 0)
	other := mustLock(t, l, "k") // on a new session
	_ = other.Unlock(context.Background())
}

// A marker deleted and put again after a fence starts its version over:
// a queueing held since before the fence, whose version that matches
// again, must still not apply, since the marker is no longer the
// session's own. (Version alone let it apply, and its waiter key, owned
// by no Lock, kept the key busy for as long as the session lived.)
func TestAMarkerPutAgainDoesNotLetALateQueueingApply(t *testing.T) {
	e := startLockEtcd(t)
	cli := e.client(t, "a", nil)
	l, sess := retiredSession(t, e, cli, LockerOptions{})
	lk := &Lock{locker: l, sess: sess, keys: []string{"k"}, waiter: "late-1", slot: 1000}
	late := l.queueing(context.Background(), lk, "{}", sess.markerVer.Load()) // sent, then held
	l.retire(lk)
	waitRetired(t, l, "k")
	ctx := context.Background()
	if _, err := cli.Delete(ctx, sess.marker); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, sess.marker, sess.markerVal); err != nil { // version 1 again
		t.Fatal(err)
	}
	if resp, err := late.Commit(); err != nil || resp.Succeeded {
		t.Fatalf("a queueing held since before its fence, after the marker was put again: applied %v, %v", err == nil && resp.Succeeded, err)
	}
	waitForWaiters(t, e.mgr, "a", "k", 0)
	// The Locker's next queueing finds the marker not its own, and ends
	// the session; the Lock after it queues on a new one.
	if _, err := l.Lock(ctx, "k"); !errors.Is(err, ErrLockLost) {
		t.Fatalf("Lock on the session whose marker was put again by another: %v, want ErrLockLost", err)
	}
	if err := context.Cause(sess.ctx); !errors.Is(err, ErrLockLost) {
		t.Fatalf("the session whose marker was put again by another: %v, want it lost", err)
	}
	_ = mustLock(t, l, "k").Unlock(ctx)
}

// A marker whose version is below one the session read (etcd restored
// from an older snapshot, which the session's lease outlived) ends the
// session with ErrEtcdRegressed: every queueing of it would be refused,
// and the Locker went on failing every Lock for as long as it lived.
// The next Lock starts a new session and takes its key.
func TestAMarkerVersionGoneBackEndsTheSession(t *testing.T) {
	e := startLockEtcd(t)
	l, sess := retiredSession(t, e, e.client(t, "a", nil), LockerOptions{})
	sess.markerVer.Add(1) // a fence after the snapshot, then the restore
	ctx := context.Background()
	if _, err := l.Lock(ctx, "free"); !errors.Is(err, ErrEtcdRegressed) {
		t.Fatalf("Lock after the marker's version went back: %v, want ErrEtcdRegressed", err)
	}
	if err := context.Cause(sess.ctx); !errors.Is(err, ErrEtcdRegressed) {
		t.Fatalf("the session after its marker's version went back: %v, want it ended with ErrEtcdRegressed", err)
	}
	_ = mustLock(t, l, "free").Unlock(ctx)
}

// Many acquisitions retired at once are cleared together: one fence, then
// a read and a transaction of deletes for each 64 keys, not a read and a
// delete for each acquisition in turn (which left a Lock of the last key
// waiting past its Timeout on a healthy etcd). Counted in etcd calls, not
// timed; the Locker's own TryLock of the last key then finds it free.
func TestManyRetirementsAreClearedTogether(t *testing.T) {
	e := startLockEtcd(t)
	var calls callCounter
	l, sess := retiredSession(t, e, e.client(t, "a", &calls), LockerOptions{})
	const n = 1000
	lks := make([]*Lock, n)
	keys := make([]string, n)
	for i := range lks {
		keys[i] = fmt.Sprintf("k%d", i)
		lks[i] = &Lock{locker: l, sess: sess, keys: keys[i : i+1], waiter: fmt.Sprintf("late-%d", i), slot: uint64(1000 + i)}
		if resp, err := l.queueing(context.Background(), lks[i], "{}", sess.markerVer.Load()).Commit(); err != nil || !resp.Succeeded {
			t.Fatalf("queueing %d: %v, %v", i, resp, err)
		}
	}
	calls.take()
	for _, lk := range lks {
		l.retire(lk)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := awaitAll(ctx, l.deletions.of(keys)); err != nil {
		t.Fatalf("%d retirements were not cleared: %v", n, err)
	}
	// The retirements come while the first fence is out, so they may be
	// split over rounds: allow three, each a fence and one part-filled
	// batch more. In turn, each acquisition took two transactions: 2,000.
	batches := (n + clearBatch - 1) / clearBatch
	if got, most := calls.take()["Txn"], 3+2*(batches+2); got > most {
		t.Fatalf("clearing %d retirements took %d transactions, want at most %d (per round, a fence, then a read and a delete for each %d keys)", n, got, most, clearBatch)
	}
	mustFindFree(t, l, keys[n-1], fmt.Sprintf("the last of %d retired keys", n))
	for _, k := range keys {
		waitForWaiters(t, e.mgr, "a", k, 0)
	}
}
