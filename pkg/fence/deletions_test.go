package fence

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// A Lock whose ctx ends while etcd does not answer returns then, not a
// Timeout later: its clean-up goes on in the background and deletes its
// waiter key once etcd answers again. Meanwhile the Locker's own next Lock
// of that key waits for the deletion, within its ctx, rather than queue
// behind its own last attempt.
func TestLockReturnsWhenItsCtxEndsWithEtcdSilent(t *testing.T) {
	e := startLockEtcd(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// A Timeout far past the moment ctx ends, and a TTL that outlives the cut.
	holder, p, l, done := stalledBehindAHolder(t, e, LockerOptions{TTL: 60 * time.Second, Timeout: 30 * time.Second}, ctx, lockK)
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Lock whose ctx was cancelled: %v, want context.Canceled", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Lock outlived its ctx by 15 s with etcd silent: its clean-up waited out the Timeout")
	}
	waitForWaiters(t, e.mgr, "a", "k", 2) // etcd has not heard of it yet
	tctx, tcancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer tcancel()
	if _, err := l.TryLock(tctx, 0, "k"); !errors.Is(err, ErrEtcdUnavailable) || !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrLockBusy) {
		t.Fatalf("TryLock while the Locker's last waiter key of k is being deleted: %v, want ErrEtcdUnavailable and the deadline, not ErrLockBusy", err)
	}
	p.flow()
	waitForWaiters(t, e.mgr, "a", "k", 1) // the background clean-up deleted it
	if err := holder.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	mustFindFree(t, l, "k", "free after the clean-up")
}

// A TryLock made once a cancelled Lock of the same key has returned finds
// the key free when nobody holds it: the cancelled Lock's waiter key may
// still be being deleted, and the TryLock waits for that rather than
// queue behind it and report ErrLockBusy.
func TestTryLockAfterACancelledLockFindsItFree(t *testing.T) {
	e := startLockEtcd(t)
	cli := e.client(t, "a", nil)
	holder := mustLock(t, e.locker(t, cli, "a", LockerOptions{}), "k")
	defer func() { _ = holder.Unlock(context.Background()) }()
	l := e.locker(t, cli, "a", LockerOptions{})
	busy := 0
	for range 40 {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			_, err := l.Lock(ctx, "k", "j")
			done <- err
		}()
		waitForWaiters(t, e.mgr, "a", "j", 1)
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled Lock: %v, want context.Canceled", err)
		}
		lk, err := l.TryLock(context.Background(), 0, "j")
		switch {
		case errors.Is(err, ErrLockBusy):
			busy++
		case err != nil:
			t.Fatal(err)
		default:
			if err := lk.Unlock(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
	}
	if busy > 0 {
		t.Fatalf("%d of 40 TryLocks of a key nobody held found it busy behind the Locker's own cancelled Lock", busy)
	}
}

// A TryLock whose wait ran out is ErrLockBusy even when its caller
// cancels ctx during the clean-up that follows (etcd silent), not the
// wait's own context.DeadlineExceeded.
func TestTryLockCancelledDuringItsCleanUpIsBusy(t *testing.T) {
	e := startLockEtcd(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	holder, p, _, done := stalledBehindAHolder(t, e, LockerOptions{TTL: 60 * time.Second, Timeout: 30 * time.Second}, ctx, func(ctx context.Context, l *Locker) error {
		_, err := l.TryLock(ctx, 300*time.Millisecond, "k")
		return err
	})
	time.Sleep(time.Second) // the wait runs out; its clean-up is not answered
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, ErrLockBusy) {
			t.Fatalf("TryLock whose wait ran out, cancelled during its clean-up: %v, want ErrLockBusy", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("TryLock outlived its ctx by 15 s with etcd silent")
	}
	p.flow()
	waitForWaiters(t, e.mgr, "a", "k", 1)
	if err := holder.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// A Lock after a cancelled Lock of the same key, with etcd silent, waits
// for the earlier clean-up for at most one Timeout, then fails with
// ErrEtcdUnavailable: not for as long as the session lives.
func TestALockAfterACancelledOneWaitsAtMostATimeout(t *testing.T) {
	e := startLockEtcd(t)
	ctx, cancel := context.WithCancel(context.Background())
	holder, p, l, done := stalledBehindAHolder(t, e, LockerOptions{TTL: 60 * time.Second, Timeout: time.Second}, ctx, lockK)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Lock: %v", err)
	}
	start := time.Now()
	_, err := l.TryLock(context.Background(), 0, "k")
	if !errors.Is(err, ErrEtcdUnavailable) || errors.Is(err, ErrLockBusy) {
		t.Fatalf("TryLock behind the Locker's own clean-up, etcd silent: %v, want ErrEtcdUnavailable", err)
	}
	if took := time.Since(start); took > 20*time.Second {
		t.Fatalf("TryLock behind the Locker's own clean-up took %s; the Timeout is 1s and the TTL 60s", took)
	}
	p.flow()
	waitForWaiters(t, e.mgr, "a", "k", 1)
	if err := holder.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// stalledBehindAHolder starts a holder of "k", and a Locker with opts
// whose etcd connection passes through a proxy; it starts call, a Lock or
// TryLock of "k" through that Locker, with ctx, waits until call's waiter
// key is written behind the holder's, and then stalls the proxy: its
// connections stay open and carry nothing, as a partition that drops
// packets leaves them (a refused connection would fail a clean-up at
// once). done gets call's error.
func stalledBehindAHolder(t *testing.T, e *lockEtcd, opts LockerOptions, ctx context.Context, call func(context.Context, *Locker) error) (holder *Lock, p *proxy, l *Locker, done <-chan error) {
	t.Helper()
	holder = mustLock(t, e.locker(t, e.client(t, "a", nil), "a", LockerOptions{}), "k")
	p = newProxy(t, strings.TrimPrefix(e.Endpoint, "https://"))
	l = e.locker(t, e.client(t, "a", nil, "https://"+p.l.Addr().String()), "a", opts)
	errs := make(chan error, 1)
	go func() { errs <- call(ctx, l) }()
	waitForWaiters(t, e.mgr, "a", "k", 2)
	p.stall()
	return holder, p, l, errs
}

func lockK(ctx context.Context, l *Locker) error {
	_, err := l.Lock(ctx, "k")
	return err
}
