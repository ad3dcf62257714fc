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
	if !errors.Is(ErrMalformedAnswer, etcdreply.ErrMalformed) {
		t.Fatal("the SDK's ErrMalformedAnswer is not the error its calls wrap")
	}
	cli, b := testenv.BrokenClient(t, startEtcd(t))
	tok := grant(t, cli, "job", 30)
	// A header at revision 0 would have Hold watch from the start of
	// history, where the key's earlier grants were deleted.
	for name, breaks := range map[string]func(any){"no header": testenv.NoHeader, "a header without a revision": testenv.EmptyHeader} {
		t.Run(name, func(t *testing.T) {
			// Both read the key and its grant marker in one transaction.
			b.Next(testenv.KVTxn, breaks)
			if _, err := Hold(context.Background(), cli, prefix, "ns", tok); !errors.Is(err, ErrMalformedAnswer) {
				t.Fatalf("Hold read a broken answer: %v; want an error naming it", err)
			}
			b.Next(testenv.KVTxn, breaks)
			err := EtcdHeld{Client: cli, Prefix: prefix, Namespace: "ns"}.Held(context.Background(), tok)
			if !errors.Is(err, ErrMalformedAnswer) || errors.Is(err, ErrLeaseLost) {
				t.Fatalf("Held read a broken answer: %v; want an error naming it, not a lost lease", err)
			}
			if err := (EtcdHeld{Client: cli, Prefix: prefix, Namespace: "ns"}).Held(context.Background(), tok); err != nil {
				t.Fatalf("the next, whole answer: %v", err)
			}
		})
	}
}

func TestALockQueueingAnsweredBrokenLeavesNoWaiter(t *testing.T) {
	e := startLockEtcd(t)
	for name, breaks := range map[string]func(any){
		"no header": testenv.NoHeader, "a header without a revision": testenv.EmptyHeader,
		"no responses": testenv.NoResponses, "puts for the reads": testenv.PutsForReads,
	} {
		t.Run(name, func(t *testing.T) {
			b := &testenv.BrokenAnswers{}
			l := e.locker(t, e.dial(t, "a", []string{e.Endpoint}, b.DialOption()), "a", LockerOptions{})
			held := mustLock(t, l, "held") // the session, before the broken answer
			b.Next(testenv.KVTxn, breaks)
			if lk, err := l.Lock(context.Background(), "k"); !errors.Is(err, etcdreply.ErrMalformed) {
				t.Fatalf("Lock answered broken: %v, %v; want an error naming the broken answer", lk, err)
			}
			// Not read as etcd gone back in time: the session and its
			// other locks live on.
			if err := held.Context().Err(); err != nil {
				t.Fatalf("the session's other lock ended: %v", context.Cause(held.Context()))
			}
			if err := held.Unlock(context.Background()); err != nil {
				t.Fatalf("the session's other lock: %v", err)
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
	time.Sleep(200 * time.Millisecond) // the waiter watches the holder's key: its next read is waitTurn's
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

func TestALockSessionAnsweredWithoutAHeader(t *testing.T) {
	e := startLockEtcd(t)
	b := &testenv.BrokenAnswers{}
	l := e.locker(t, e.dial(t, "a", []string{e.Endpoint}, b.DialOption()), "a", LockerOptions{})
	b.Next(testenv.LeaseGrant, testenv.NoHeader)
	if lk, err := l.Lock(context.Background(), "k"); !errors.Is(err, ErrMalformedAnswer) {
		t.Fatalf("Lock with its session's grant answered without a header: %v, %v; want an error naming it", lk, err)
	}
	_ = mustLock(t, l, "k").Unlock(context.Background()) // the next session is whole
}

// An Unlock whose delete is answered with responses of the wrong kind does
// not know whether its keys went: it says so, not that the lock was lost,
// and deletes them again until they are gone.
func TestAnUnlockAnsweredBrokenIsNotALostLock(t *testing.T) {
	e := startLockEtcd(t)
	b := &testenv.BrokenAnswers{}
	l := e.locker(t, e.dial(t, "a", []string{e.Endpoint}, b.DialOption()), "a", LockerOptions{})
	lk := mustLock(t, l, "k")
	b.Next(testenv.KVTxn, testenv.PutsForReads)
	if err := lk.Unlock(context.Background()); !errors.Is(err, ErrMalformedAnswer) || errors.Is(err, ErrLockLost) {
		t.Fatalf("Unlock answered broken: %v; want an error naming the broken answer, not a lost lock", err)
	}
	waitForWaiters(t, e.mgr, "a", "k", 0)
	_ = mustLock(t, l, "k").Unlock(context.Background()) // the session lives on
}
