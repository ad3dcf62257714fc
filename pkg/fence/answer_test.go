package fence

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-io/fencer/internal/etcdreply"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
	"github.com/fencer-io/fencer/test/support/testenv"
)

// An answer from etcd that does not match its request (what a faulty proxy
// could send) is an error in a user's process: never a panic, never read as
// a fact about the lease, and never a waiter key left blocking a lock.

func TestAFencedTxnAnsweredBrokenIsAnError(t *testing.T) {
	cli, b := testenv.BrokenClient(t, startEtcd(t))
	ctx := context.Background()
	old := grant(t, cli, "job", 30)
	if _, err := cli.Delete(ctx, etcdkeys.LeaseKey(prefix, "ns", "job")); err != nil {
		t.Fatal(err)
	}
	grant(t, cli, "job", 30)
	for name, breaks := range map[string]func(any){"no responses": testenv.NoResponses, "a put for the read": testenv.PutsForReads} {
		t.Run(name, func(t *testing.T) {
			b.Next(testenv.KVTxn, breaks)
			_, err := NewTxn(cli, prefix, "ns", old).Then(clientv3.OpPut("/data/x", "stale")).Commit(ctx)
			var fenced *FencedError
			if !errors.Is(err, etcdreply.ErrMalformed) || errors.As(err, &fenced) {
				t.Fatalf("a stale token's transaction answered broken: %v; want an error naming the broken answer, not a FencedError read from it", err)
			}
		})
	}
}

func TestHoldAndHeldAnsweredWithoutAHeader(t *testing.T) {
	cli, b := testenv.BrokenClient(t, startEtcd(t))
	tok := grant(t, cli, "job", 30)
	b.Next(testenv.KVRange, testenv.NoHeader)
	if _, err := Hold(context.Background(), cli, prefix, "ns", tok); !errors.Is(err, etcdreply.ErrMalformed) {
		t.Fatalf("Hold read an answer without a header: %v; want an error naming it", err)
	}
	b.Next(testenv.KVRange, testenv.NoHeader)
	err := EtcdHeld{Client: cli, Prefix: prefix, Namespace: "ns"}.Held(context.Background(), tok)
	if !errors.Is(err, etcdreply.ErrMalformed) || errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Held read an answer without a header: %v; want an error naming it, not a lost lease", err)
	}
	if err := (EtcdHeld{Client: cli, Prefix: prefix, Namespace: "ns"}).Held(context.Background(), tok); err != nil {
		t.Fatalf("the next, whole answer: %v", err)
	}
}

func TestALockQueueingAnsweredBrokenLeavesNoWaiter(t *testing.T) {
	e := startLockEtcd(t)
	for name, breaks := range map[string]func(any){
		"no header": testenv.NoHeader, "no responses": testenv.NoResponses, "puts for the reads": testenv.PutsForReads,
	} {
		t.Run(name, func(t *testing.T) {
			b := &testenv.BrokenAnswers{}
			l := e.locker(t, e.dial(t, "a", []string{e.Endpoint}, b.DialOption()), "a", LockerOptions{})
			_ = mustLock(t, l, "warm").Unlock(context.Background()) // the session, before the broken answer
			b.Next(testenv.KVTxn, breaks)
			if lk, err := l.Lock(context.Background(), "k"); !errors.Is(err, etcdreply.ErrMalformed) {
				t.Fatalf("Lock answered broken: %v, %v; want an error naming the broken answer", lk, err)
			}
			// The queueing applied in etcd: its waiter key must not block
			// the lock for as long as the session lives.
			waitForWaiters(t, e.mgr, "a", "k", 0)
			other := mustLock(t, e.locker(t, e.client(t, "a", nil), "a", LockerOptions{}), "k")
			_ = other.Unlock(context.Background())
		})
	}
}

func TestAWaiterAnsweredBrokenGivesUpItsPlace(t *testing.T) {
	e := startLockEtcd(t)
	holder := mustLock(t, e.locker(t, e.client(t, "a", nil), "a", LockerOptions{}), "k")
	b := &testenv.BrokenAnswers{}
	l := e.locker(t, e.dial(t, "a", []string{e.Endpoint}, b.DialOption()), "a", LockerOptions{})
	done := make(chan error, 1)
	go func() {
		_, err := l.Lock(context.Background(), "k")
		done <- err
	}()
	waitForWaiters(t, e.mgr, "a", "k", 2)
	time.Sleep(200 * time.Millisecond) // the waiter watches the holder's key
	b.Next(testenv.KVTxn, testenv.NoResponses)
	if err := holder.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, etcdreply.ErrMalformed) {
			t.Fatalf("the waiter's turn answered broken: %v; want an error naming the broken answer", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter neither took the lock nor gave up")
	}
	waitForWaiters(t, e.mgr, "a", "k", 0)
	_ = mustLock(t, e.locker(t, e.client(t, "a", nil), "a", LockerOptions{}), "k").Unlock(context.Background())
}
