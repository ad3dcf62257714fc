package fence

import (
	"bytes"
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// A queueing whose outcome was unknown may apply after its caller gave up:
// while its keys are watched, they are deleted the moment they appear, so
// they never block the lock. The poll is set far off: only the watch can
// delete the key here.
func TestARetiredQueueingLeavesNoKey(t *testing.T) {
	e := startLockEtcd(t)
	cli := e.client(t, "a", nil)
	l := e.locker(t, cli, "a", LockerOptions{})
	l.sweepPoll = time.Hour
	_ = mustLock(t, l, "warm").Unlock(context.Background())
	sess, err := l.session(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	lk := &Lock{locker: l, sess: sess, keys: []string{"k"}, waiter: "late-1"}
	l.retire(lk)
	time.Sleep(200 * time.Millisecond) // the sweep watches
	// The transaction applies late.
	if _, err := cli.Put(context.Background(), lk.waiterKey("k"), "{}", clientv3.WithLease(sess.id)); err != nil {
		t.Fatal(err)
	}
	waitForWaiters(t, e.mgr, "a", "k", 0)
	other := mustLock(t, e.locker(t, cli, "a", LockerOptions{}), "k")
	_ = other.Unlock(context.Background())
}

// Many retired queueings do not each keep a watch and a goroutine for as
// long as the session lives: past their watch, their keys are polled by
// one goroutine per session, which still deletes a key that appears late.
func TestRetiredKeysShareOnePoller(t *testing.T) {
	e := startLockEtcd(t)
	cli := e.client(t, "a", nil)
	l := e.locker(t, cli, "a", LockerOptions{})
	l.sweepWatch, l.sweepPoll = 300*time.Millisecond, 100*time.Millisecond
	_ = mustLock(t, l, "warm").Unlock(context.Background())
	sess, err := l.session(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	const n = 150 // more than one poll batch
	retired := make([]*Lock, n)
	for i := range retired {
		retired[i] = &Lock{locker: l, sess: sess, keys: []string{fmt.Sprintf("k%d", i)}, waiter: fmt.Sprintf("late-%d", i)}
		l.retire(retired[i])
	}
	if got := sweepGoroutines(t, "watchAndDelete", func(n int) bool { return n == 0 }); got != 0 {
		t.Fatalf("%d retired keys are still watched after their watch ended", got)
	}
	if got := sweepGoroutines(t, "pollRetired", func(n int) bool { return n == 1 }); got != 1 {
		t.Fatalf("%d pollers run for one session, want 1", got)
	}
	// Every transaction applies late, past the watch: the poller deletes
	// each key, whichever batch it is in.
	for _, lk := range retired {
		if _, err := cli.Put(context.Background(), lk.waiterKey(lk.keys[0]), "{}", clientv3.WithLease(sess.id)); err != nil {
			t.Fatal(err)
		}
	}
	for _, lk := range retired {
		waitForWaiters(t, e.mgr, "a", lk.keys[0], 0)
	}
	other := mustLock(t, e.locker(t, cli, "a", LockerOptions{}), "k0")
	_ = other.Unlock(context.Background())
}

// sweepGoroutines counts the goroutines running fn of this package, until
// done accepts the count or 30 s pass, and returns the last count.
func sweepGoroutines(t *testing.T, fn string, done func(int) bool) int {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		buf := make([]byte, 1<<22)
		buf = buf[:runtime.Stack(buf, true)]
		n := bytes.Count(buf, []byte("fence.(*Locker)."+fn+"("))
		if done(n) || time.Now().After(deadline) {
			return n
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Retired keys leave the poll list after sweepKeepFor, and the poller
// stops with the list empty; the next retirement starts it again.
func TestRetiredKeysLeaveThePollListAfterTheirKeep(t *testing.T) {
	e := startLockEtcd(t)
	cli := e.client(t, "a", nil)
	l := e.locker(t, cli, "a", LockerOptions{})
	l.sweepWatch, l.sweepPoll, l.sweepKeep = 100*time.Millisecond, 50*time.Millisecond, 300*time.Millisecond
	_ = mustLock(t, l, "warm").Unlock(context.Background())
	sess, err := l.session(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		l.retire(&Lock{locker: l, sess: sess, keys: []string{fmt.Sprintf("k%d", i)}, waiter: fmt.Sprintf("late-%d", i)})
	}
	if got := sweepGoroutines(t, "pollRetired", func(n int) bool { return n == 1 }); got != 1 {
		t.Fatalf("%d pollers after 10 retirements, want 1", got)
	}
	if got := sweepGoroutines(t, "pollRetired", func(n int) bool { return n == 0 }); got != 0 {
		t.Fatalf("%d pollers still run after every retired key's keep ended", got)
	}
	sess.mu.Lock()
	left := len(sess.retired)
	sess.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d keys left on the retired list after their keep", left)
	}
	lk := &Lock{locker: l, sess: sess, keys: []string{"again"}, waiter: "late-again"}
	l.retire(lk)
	if got := sweepGoroutines(t, "pollRetired", func(n int) bool { return n == 1 }); got != 1 {
		t.Fatalf("%d pollers after a retirement on an empty list, want 1", got)
	}
	if _, err := cli.Put(context.Background(), lk.waiterKey("again"), "{}", clientv3.WithLease(sess.id)); err != nil {
		t.Fatal(err)
	}
	waitForWaiters(t, e.mgr, "a", "again", 0)
}

// A retired key that etcd could not read while it was watched (etcd
// silent for longer than the watch) is read and deleted as soon as etcd
// answers, not a poll later: the sweep's first read is retried until it
// succeeds, and the Locker's own TryLock waits for it.
func TestARetiredKeyUnreadDuringAStallGoesWhenEtcdAnswers(t *testing.T) {
	e := startLockEtcd(t)
	p := newProxy(t, strings.TrimPrefix(e.Endpoint, "https://"))
	cli := e.client(t, "a", nil, "https://"+p.l.Addr().String())
	l := e.locker(t, cli, "a", LockerOptions{TTL: 60 * time.Second, Timeout: 500 * time.Millisecond})
	l.sweepPoll = time.Hour // only the sweep's own read can delete the key
	_ = mustLock(t, l, "warm").Unlock(context.Background())
	sess, err := l.session(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	lk := &Lock{locker: l, sess: sess, keys: []string{"j"}, waiter: "late-1"}
	// The queueing applied; its answer, like everything else, is stalled.
	if _, err := e.mgr.Put(context.Background(), lk.waiterKey("j"), "{}", clientv3.WithLease(sess.id)); err != nil {
		t.Fatal(err)
	}
	p.stall()
	l.retire(lk)
	time.Sleep(2 * l.sweepWatchFor()) // past the watch
	p.flow()
	waitForWaiters(t, e.mgr, "a", "j", 0)
	got, err := l.TryLock(context.Background(), 0, "j")
	if err != nil {
		t.Fatalf("TryLock of j, whose retired key is gone and which nobody holds: %v", err)
	}
	_ = got.Unlock(context.Background())
}

// A queueing etcd refused outright (here, too many operations in one
// transaction) was never applied and never will be: it is not retired,
// so it costs no sweep and no wait for the next Lock of its keys.
func TestARefusedQueueingIsNotRetired(t *testing.T) {
	e := startLockEtcd(t)
	l := e.locker(t, e.client(t, "a", nil), "a", LockerOptions{})
	keys := make([]string, 65) // 2 operations a key, over etcd's 128
	for i := range keys {
		keys[i] = fmt.Sprintf("k%d", i)
	}
	if _, err := l.Lock(context.Background(), keys...); err == nil {
		t.Fatal("etcd took a queueing of 65 keys; the test needs one it refuses")
	}
	if n := sweepGoroutines(t, "sweep", func(int) bool { return true }); n != 0 {
		t.Fatalf("%d sweeps for a queueing etcd refused", n)
	}
	lk, err := l.TryLock(context.Background(), 0, "k0")
	if err != nil {
		t.Fatalf("TryLock of a key whose queueing etcd refused: %v", err)
	}
	_ = lk.Unlock(context.Background())
}
