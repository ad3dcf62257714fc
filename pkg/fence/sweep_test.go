package fence

import (
	"bytes"
	"context"
	"fmt"
	"runtime"
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
