package fence

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"k8s.io/apimachinery/pkg/types"

	"github.com/fencer-io/fencer/internal/identity"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
	"github.com/fencer-io/fencer/test/support/testenv"
)

// lockEtcd is an etcd as the chart runs it (TLS, client certificates, auth
// on) with the namespace identities of "a" and "b", as the manager sets
// them up.
type lockEtcd struct {
	*testenv.SecureEtcd
	mgr *clientv3.Client
}

func startLockEtcd(t testing.TB) *lockEtcd {
	t.Helper()
	e := testenv.StartSecureEtcd(t, prefix)
	mgr := e.Client(t, "manager")
	for _, ns := range []string{"a", "b"} {
		if err := identity.EnsureNamespace(context.Background(), mgr, prefix, ns, types.UID("uid-"+ns), nil); err != nil {
			t.Fatal(err)
		}
		if err := e.PKI.Issue(ns, identity.Request{CommonName: identity.NamespaceUser(prefix, ns, types.UID("uid-"+ns))}); err != nil {
			t.Fatal(err)
		}
	}
	return &lockEtcd{SecureEtcd: e, mgr: mgr}
}

// client connects as namespace ns's identity; calls, when set, counts its
// unary etcd calls by method.
func (e *lockEtcd) client(t testing.TB, ns string, calls *callCounter, endpoint ...string) *clientv3.Client {
	t.Helper()
	if len(endpoint) == 0 {
		endpoint = []string{e.Endpoint}
	}
	var opts []grpc.DialOption
	if calls != nil {
		opts = append(opts, grpc.WithChainUnaryInterceptor(calls.intercept))
	}
	return e.dial(t, ns, endpoint, opts...)
}

// dial connects as namespace ns's identity to endpoint, with opts.
func (e *lockEtcd) dial(t testing.TB, ns string, endpoint []string, opts ...grpc.DialOption) *clientv3.Client {
	t.Helper()
	tlsCfg, err := e.PKI.TLS(ns)
	if err != nil {
		t.Fatal(err)
	}
	cfg := clientv3.Config{Endpoints: endpoint, TLS: tlsCfg, DialTimeout: 5 * time.Second, Logger: zap.NewNop(), DialOptions: opts}
	cli, err := clientv3.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

func (e *lockEtcd) locker(t testing.TB, cli *clientv3.Client, ns string, opts LockerOptions) *Locker {
	t.Helper()
	l, err := NewLocker(cli, prefix, ns, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	return l
}

// callCounter counts unary gRPC calls: etcd round trips.
type callCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *callCounter) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	c.mu.Lock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[method[strings.LastIndex(method, "/")+1:]]++
	c.mu.Unlock()
	return invoker(ctx, method, req, reply, cc, opts...)
}

func (c *callCounter) take() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.n
	c.n = nil
	return n
}

func total(calls map[string]int) (n int) {
	for _, c := range calls {
		n += c
	}
	return n
}

// Names of waiter keys are reused once their keys are gone, never while
// an acquisition under one lives, and a late delete of an earlier
// acquisition under a reused name deletes nothing.
func TestWaiterNamesAreReusedSafely(t *testing.T) {
	e := startLockEtcd(t)
	cli := e.client(t, "a", nil)
	l := e.locker(t, cli, "a", LockerOptions{})
	first := mustLock(t, l, "k")
	second := mustLock(t, l, "other") // while first lives: another name
	if first.waiter == second.waiter {
		t.Fatalf("two live acquisitions share the waiter name %s", first.waiter)
	}
	old := first.Token("k")
	if err := first.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	third := mustLock(t, l, "k")
	if third.waiter != first.waiter {
		t.Fatalf("a freed name was not reused: %s after %s", third.waiter, first.waiter)
	}
	// The first acquisition's delete, arriving late: it compares the
	// revision it had, and the third's key stays.
	w := etcdkeys.LockWaiterKey(prefix, "a", "k", old.Waiter)
	resp, err := cli.Txn(context.Background()).If(clientv3.Compare(clientv3.CreateRevision(w), "=", old.Value)).Then(clientv3.OpDelete(w)).Commit()
	if err != nil || resp.Succeeded {
		t.Fatalf("a late delete of the first acquisition: succeeded %v, %v", resp != nil && resp.Succeeded, err)
	}
	if err := write(cli, "a", old, "x", "stale"); err == nil {
		t.Fatal("the first acquisition's token passes the fence under the reused name")
	}
	if err := write(cli, "a", third.Token("k"), "x", "third"); err != nil {
		t.Fatalf("the third acquisition's write: %v", err)
	}
}

// The Locker's own delete, arriving late (its first try timed out at the
// client but stayed in flight, the retry freed the name, and the next
// Lock reused it), compares the revision its acquisition had: the reused
// name's key stays, for one key and for a set, whose deletes are each
// compared on their own.
func TestALateDeleteOfAnEarlierAcquisitionLeavesTheReusedName(t *testing.T) {
	for _, keys := range [][]string{{"k"}, {"k", "j"}} {
		t.Run(strings.Join(keys, ","), func(t *testing.T) {
			e := startLockEtcd(t)
			cli := e.client(t, "a", nil)
			l := e.locker(t, cli, "a", LockerOptions{})
			first := mustLock(t, l, keys...)
			late := &Lock{locker: l, sess: first.sess, keys: first.keys, waiter: first.waiter, slot: first.slot, token: first.token}
			if err := first.Unlock(context.Background()); err != nil {
				t.Fatal(err)
			}
			third := mustLock(t, l, keys...)
			if third.waiter != first.waiter {
				t.Fatalf("a freed name was not reused: %s after %s", third.waiter, first.waiter)
			}
			deleted, err := l.deleteWaitersCtx(context.Background(), late)
			if err != nil {
				t.Fatal(err)
			}
			if slices.Contains(deleted, true) {
				t.Errorf("the late delete reports keys deleted: %v", deleted)
			}
			for _, k := range keys {
				if err := write(cli, "a", third.Token(k), "x-"+k, "third"); err != nil {
					t.Fatalf("the first acquisition's late delete freed the third's lock on %q: %v", k, err)
				}
			}
		})
	}
}

// A waiter key left at the name a Lock is about to take (a queueing whose
// clean-up never ran) is not taken over: a put on it would keep its
// revision, and the Lock would hold under a token that is not its own
// queueing's, one an earlier acquisition may hold too. The Lock queues
// under a fresh revision instead.
func TestALeftoverKeyAtAWaitersNameIsNotTakenOver(t *testing.T) {
	e := startLockEtcd(t)
	cli := e.client(t, "a", nil)
	l := e.locker(t, cli, "a", LockerOptions{})
	warm := mustLock(t, l, "k")
	name := warm.waiter
	if err := warm.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	left, err := e.mgr.Put(context.Background(), etcdkeys.LockWaiterKey(prefix, "a", "k", name), `{"pod":"earlier"}`)
	if err != nil {
		t.Fatal(err)
	}
	lk := mustLock(t, l, "k")
	if tok := lk.Token("k").Value; tok <= left.Header.Revision {
		t.Fatalf("the Lock holds under token %d, the leftover key's revision was %d: want a queueing of its own", tok, left.Header.Revision)
	}
	if err := write(cli, "a", lk.Token("k"), "x", "mine"); err != nil {
		t.Fatalf("the Lock's write: %v", err)
	}
}

// A waiter whose key was deleted while it queued (by an identity allowed
// to delete keys under the namespace) is not told it holds the lock when
// the waiter ahead leaves: Lock returns ErrLockLost.
func TestAWaiterWhoseKeyWasDeletedIsNotGivenTheLock(t *testing.T) {
	e := startLockEtcd(t)
	cli := e.client(t, "a", nil)
	holder := mustLock(t, e.locker(t, cli, "a", LockerOptions{}), "k")
	errc := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		lk, err := e.locker(t, cli, "a", LockerOptions{}).Lock(ctx, "k")
		if lk != nil {
			_ = lk.Unlock(context.Background())
		}
		errc <- err
	}()
	waiter := waitForWaiters(t, e.mgr, "a", "k", 2)[1]
	if _, err := e.mgr.Delete(context.Background(), etcdkeys.LockWaiterKey(prefix, "a", "k", waiter.Waiter)); err != nil {
		t.Fatal(err)
	}
	if err := holder.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; !errors.Is(err, ErrLockLost) {
		t.Fatalf("the waiter whose key was deleted: %v, want ErrLockLost", err)
	}
}

// The holder's mark (for kubectl fencer locks), arriving after its Unlock,
// puts nothing back: a key put again would outlive the acquisition on the
// session's lease and keep every later waiter out.
func TestALateHeldMarkDoesNotPutTheKeyBack(t *testing.T) {
	e := startLockEtcd(t)
	cli := e.client(t, "a", nil)
	l := e.locker(t, cli, "a", LockerOptions{})
	lk := mustLock(t, l, "k", "j")
	if err := lk.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	l.markHeld(lk)
	resp, err := e.mgr.Get(context.Background(), etcdkeys.NamespaceLocksPrefix(prefix, "a"), clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		if _, _, waiter, ok := etcdkeys.ParseLockWaiterKey(prefix, string(kv.Key)); ok && waiter == lk.waiter {
			t.Errorf("after Unlock, a late mark put back %s", kv.Key)
		}
	}
}

// mustFindFree takes key with TryLock, waiting for nothing, and unlocks
// it: the key must be free (why says why it should be).
func mustFindFree(t testing.TB, l *Locker, key, why string) {
	t.Helper()
	lk, err := l.TryLock(context.Background(), 0, key)
	if err != nil {
		t.Fatalf("TryLock of %s, %s: %v", key, why, err)
	}
	_ = lk.Unlock(context.Background())
}

// lockUnlock locks key and unlocks it, for goroutines of a test: it
// reports a failure with t.Error and returns false, for the goroutine to
// stop.
func lockUnlock(t testing.TB, l *Locker, key string) bool {
	t.Helper()
	lk, err := l.Lock(context.Background(), key)
	if err != nil {
		t.Errorf("Lock(%s): %v", key, err)
		return false
	}
	if err := lk.Unlock(context.Background()); err != nil {
		t.Errorf("Unlock(%s): %v", key, err)
		return false
	}
	return true
}

func mustLock(t testing.TB, l *Locker, keys ...string) *Lock {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	lk, err := l.Lock(ctx, keys...)
	if err != nil {
		t.Fatalf("Lock(%q): %v", keys, err)
	}
	return lk
}

// write puts key under tok's fence, as a holder writes its data.
func write(cli *clientv3.Client, ns string, tok LockToken, key, val string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := NewTxn(cli, prefix, ns, tok).Then(clientv3.OpPut(etcdkeys.DataPrefix(prefix, ns)+key, val)).Commit(ctx)
	return err
}

func TestLockTokensIncreaseAndFenceTheOldHolder(t *testing.T) {
	e := startLockEtcd(t)
	cli := e.client(t, "a", nil)
	l := e.locker(t, cli, "a", LockerOptions{Pod: "web-0", PodUID: "u0"})

	first := mustLock(t, l, "dir/42")
	old := first.Token("dir/42")
	if err := write(cli, "a", old, "x", "first"); err != nil {
		t.Fatalf("the holder's write: %v", err)
	}
	if err := first.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	second := mustLock(t, l, "dir/42")
	nu := second.Token("dir/42")
	if nu.Value <= old.Value {
		t.Fatalf("token %d after %d: tokens must strictly increase", nu.Value, old.Value)
	}
	var fenced *FencedError
	if err := write(cli, "a", old, "x", "stale"); !errors.As(err, &fenced) || fenced.Current != nu.Value || fenced.Offered != old.Value {
		t.Fatalf("the old holder's write: %v, want a FencedError naming current token %d", err, nu.Value)
	}
	if err := write(cli, "a", nu, "x", "second"); err != nil {
		t.Fatalf("the new holder's write: %v", err)
	}
	// A forged token: the live value with another waiter's name.
	forged := nu
	forged.Waiter = "0-1"
	if err := write(cli, "a", forged, "x", "forged"); !errors.As(err, &fenced) {
		t.Fatalf("a forged waiter: %v, want a FencedError", err)
	}
	if err := write(cli, "a", LockToken{Key: "dir/42"}, "x", "none"); !errors.Is(err, ErrNoToken) {
		t.Fatalf("token 0: %v", err)
	}
}

// Token of a key the Lock did not take is the zero token, refused by every
// fence. It used to carry the set's value: refused in etcd (no waiter of
// this Lock under that key), but a database guard sees only the number,
// so a holder of "dir/b" that asked for "dir/a"'s token by mistake wrote
// dir/a's rows while another held it, and the real holder was refused.
func TestTokenOfAKeyNotLockedIsNoToken(t *testing.T) {
	e := startLockEtcd(t)
	cli := e.client(t, "a", nil)
	other := e.locker(t, e.client(t, "a", nil), "a", LockerOptions{Pod: "web-0", PodUID: "u0"})
	l := e.locker(t, cli, "a", LockerOptions{Pod: "web-1", PodUID: "u1"})
	holder := mustLock(t, other, "dir/a")
	mine := mustLock(t, l, "dir/b", "dir/c")
	if mine.Token("dir/b").Value <= holder.Token("dir/a").Value {
		t.Fatalf("the later set's token %d is not above the holder's %d", mine.Token("dir/b").Value, holder.Token("dir/a").Value)
	}
	got := mine.Token("dir/a")
	if got != (LockToken{Key: "dir/a"}) {
		t.Fatalf("Token of a key not locked: %+v, want the zero token", got)
	}
	if err := write(cli, "a", got, "x", "not mine"); !errors.Is(err, ErrNoToken) {
		t.Fatalf("a write under it: %v, want ErrNoToken", err)
	}
	for _, tok := range mine.Tokens() {
		if tok.Value != mine.Token("dir/b").Value || tok.Waiter == "" {
			t.Fatalf("Tokens: %+v, want the set's value for every key locked", mine.Tokens())
		}
	}
}

// The same, with the waiter queued at the revision right after the
// holder's (both sessions warm and nothing written between): the fence's
// "no waiter older than the token" comparison must refuse a waiter at
// exactly the holder's token + 1.
func TestAWaiterRightBehindTheHolderCannotPassTheFence(t *testing.T) {
	e := startLockEtcd(t)
	cli := e.client(t, "a", nil)
	lh := e.locker(t, cli, "a", LockerOptions{})
	lw := e.locker(t, cli, "a", LockerOptions{})
	for _, warm := range []*Locker{lh, lw} { // each session's marker written
		if err := mustLock(t, warm, "warm").Unlock(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	holder := mustLock(t, lh, "k")
	got := make(chan *Lock, 1)
	go func() { got <- mustLock(t, lw, "k") }()
	waiter := waitForWaiters(t, e.mgr, "a", "k", 2)[1]
	if waiter.Value != holder.Token("k").Value+1 {
		t.Fatalf("setup: the waiter queued at %d, the holder at %d: the test needs adjacent revisions", waiter.Value, holder.Token("k").Value)
	}
	var fenced *FencedError
	if err := write(cli, "a", waiter, "x", "queued"); !errors.As(err, &fenced) || fenced.Current != holder.Token("k").Value {
		t.Fatalf("a waiter's write while the holder (token %d) holds: %v, want a FencedError naming the holder's token", holder.Token("k").Value, err)
	}
	if err := write(cli, "a", holder.Token("k"), "x", "holder"); err != nil {
		t.Fatalf("the holder's write: %v", err)
	}
	if err := holder.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	_ = (<-got).Unlock(context.Background())
}

// A waiter's key exists with its revision while it queues: the fence must
// refuse it all the same, and let it through once it holds.
func TestAWaiterCannotPassTheFence(t *testing.T) {
	e := startLockEtcd(t)
	cli := e.client(t, "a", nil)
	holder := mustLock(t, e.locker(t, cli, "a", LockerOptions{}), "k")
	got := make(chan *Lock, 1)
	go func() { got <- mustLock(t, e.locker(t, cli, "a", LockerOptions{}), "k") }()
	waiter := waitForWaiters(t, e.mgr, "a", "k", 2)[1]
	var fenced *FencedError
	if err := write(cli, "a", waiter, "x", "queued"); !errors.As(err, &fenced) || fenced.Current != holder.Token("k").Value {
		t.Fatalf("a waiter's write: %v, want a FencedError naming the holder's token", err)
	}
	if err := holder.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	next := <-got
	if next.Token("k") != waiter {
		t.Fatalf("the waiter got %+v, queued as %+v", next.Token("k"), waiter)
	}
	if err := write(cli, "a", waiter, "x", "held"); err != nil {
		t.Fatalf("the new holder's write: %v", err)
	}
}

// waitForWaiters waits until key has n waiter keys and returns their
// tokens, oldest first.
func waitForWaiters(t testing.TB, cli *clientv3.Client, ns, key string, n int) []LockToken {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := cli.Get(context.Background(), etcdkeys.LockPrefix(prefix, ns, key), clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) == n {
			out := make([]LockToken, n)
			for i, kv := range resp.Kvs {
				_, _, waiter, _ := etcdkeys.ParseLockWaiterKey(prefix, string(kv.Key))
				out[i] = LockToken{Key: key, Value: kv.CreateRevision, Waiter: waiter}
			}
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s has %d waiters, want %d", key, len(resp.Kvs), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Waiters are served in the order they queued, and a release wakes only
// the next: the others make no etcd call until their own turn comes.
func TestWaitersAreServedInOrderAndOneIsWoken(t *testing.T) {
	e := startLockEtcd(t)
	holder := mustLock(t, e.locker(t, e.client(t, "a", nil), "a", LockerOptions{}), "k")
	const n = 4
	calls := make([]*callCounter, n)
	order := make(chan int, n)
	locks := make([]*Lock, n)
	for i := range n {
		calls[i] = &callCounter{}
		l := e.locker(t, e.client(t, "a", calls[i]), "a", LockerOptions{})
		go func() {
			locks[i] = mustLock(t, l, "k")
			order <- i
		}()
		waitForWaiters(t, e.mgr, "a", "k", i+2) // queued in order 0..n-1
	}
	time.Sleep(200 * time.Millisecond) // every waiter watches its predecessor
	for _, c := range calls {
		c.take()
	}
	if err := holder.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	for want := range n {
		got := <-order
		if got != want {
			t.Fatalf("waiter %d got the lock, want %d (arrival order)", got, want)
		}
		time.Sleep(200 * time.Millisecond) // a woken waiter would call etcd by now
		for i := want + 1; i < n; i++ {
			if c := calls[i].take(); len(c) > 0 {
				t.Fatalf("waiter %d made etcd calls %v when waiter %d was woken: a release must wake one", i, c, want)
			}
		}
		if err := locks[got].Unlock(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// Two goroutines of one process never share a lock, and the first's late
// Unlock does not free the second's (etcd-io/etcd#22082).
func TestOneLockerNeverSharesALockBetweenGoroutines(t *testing.T) {
	e := startLockEtcd(t)
	cli := e.client(t, "a", nil)
	l := e.locker(t, cli, "a", LockerOptions{})
	first := mustLock(t, l, "k")
	got := make(chan *Lock, 1)
	go func() { got <- mustLock(t, l, "k") }()
	waitForWaiters(t, e.mgr, "a", "k", 2)
	select {
	case <-got:
		t.Fatal("a second Lock of a held key returned: locks are not reentrant, it must queue")
	case <-time.After(300 * time.Millisecond):
	}
	if err := first.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	second := <-got
	if err := first.Unlock(context.Background()); err != nil {
		t.Fatalf("a repeated Unlock: %v", err)
	}
	if err := write(cli, "a", second.Token("k"), "x", "second"); err != nil {
		t.Fatalf("the first's repeated Unlock freed the second's lock: %v", err)
	}
	if second.Context().Err() != nil {
		t.Fatal("the second's context ended")
	}
}

// A holder that lost its lock, then retries Unlock, deletes nothing of the
// holder after it, and hears that it had lost the lock.
func TestUnlockAfterLossLeavesTheNextHolder(t *testing.T) {
	e := startLockEtcd(t)
	cli := e.client(t, "a", nil)
	stale := mustLock(t, e.locker(t, cli, "a", LockerOptions{}), "k")
	ctx := stale.Context()
	if _, err := e.mgr.Revoke(context.Background(), stale.sess.id); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ctx.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the revoked lock's context did not end")
	}
	if !errors.Is(context.Cause(ctx), ErrLockLost) {
		t.Fatalf("cause %v, want ErrLockLost", context.Cause(ctx))
	}
	next := mustLock(t, e.locker(t, cli, "a", LockerOptions{}), "k")
	for range 2 { // the retry too
		if err := stale.Unlock(context.Background()); err != nil && !errors.Is(err, ErrLockLost) {
			t.Fatalf("stale Unlock: %v, want nil or ErrLockLost", err)
		}
	}
	if err := write(cli, "a", next.Token("k"), "x", "next"); err != nil {
		t.Fatalf("a stale Unlock freed the next holder's lock: %v", err)
	}
}

func TestUnlockOfALostLockSaysSo(t *testing.T) {
	e := startLockEtcd(t)
	lk := mustLock(t, e.locker(t, e.client(t, "a", nil), "a", LockerOptions{}), "k")
	if _, err := e.mgr.Delete(context.Background(), lk.waiterKey("k")); err != nil {
		t.Fatal(err)
	}
	if err := lk.Unlock(context.Background()); !errors.Is(err, ErrLockLost) {
		t.Fatalf("Unlock of a lock whose key was deleted: %v, want ErrLockLost", err)
	}
}

// Sets that overlap, named in any order, never deadlock, and no key ever
// has two holders.
func TestOverlappingSetsNeverDeadlock(t *testing.T) {
	e := startLockEtcd(t)
	keys := []string{"src", "dst", "tree", "log"}
	var holders [4]atomic.Int32
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 6 {
		l := e.locker(t, e.client(t, "a", nil), "a", LockerOptions{})
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for range 15 {
				idx := rng.Perm(len(keys))[:1+rng.IntN(3)]
				set := make([]string, len(idx))
				for i, k := range idx {
					set[i] = keys[k]
				}
				lk, err := l.Lock(ctx, set...)
				if err != nil {
					errs <- fmt.Errorf("Lock(%q): %w (a deadlock runs into the test's deadline)", set, err)
					return
				}
				for _, k := range idx {
					if holders[k].Add(1) != 1 {
						errs <- fmt.Errorf("%s has two holders", keys[k])
					}
				}
				time.Sleep(time.Millisecond)
				for _, k := range idx {
					holders[k].Add(-1)
				}
				if err := lk.Unlock(ctx); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestTryLockGivesUpAndLeavesNoWaiter(t *testing.T) {
	e := startLockEtcd(t)
	cli := e.client(t, "a", nil)
	holder := mustLock(t, e.locker(t, cli, "a", LockerOptions{}), "k")
	l := e.locker(t, cli, "a", LockerOptions{})
	for _, wait := range []time.Duration{0, 200 * time.Millisecond} {
		if _, err := l.TryLock(context.Background(), wait, "k", "free"); !errors.Is(err, ErrLockBusy) {
			t.Fatalf("TryLock(wait %s) of a held key: %v, want ErrLockBusy", wait, err)
		}
		waitForWaiters(t, e.mgr, "a", "k", 1)
		waitForWaiters(t, e.mgr, "a", "free", 0)
	}
	// A key that is no key is not busy, whatever the wait.
	for _, keys := range [][]string{{""}, {"k", "k"}} {
		if _, err := l.TryLock(context.Background(), 0, keys...); errors.Is(err, ErrLockBusy) || !errors.Is(err, etcdkeys.ErrBadLockKey) {
			t.Fatalf("TryLock(0, %q): %v, want ErrBadLockKey", keys, err)
		}
	}
	// Lock's own ctx ending cleans up too.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := l.Lock(ctx, "k"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock with an ending ctx: %v", err)
	}
	waitForWaiters(t, e.mgr, "a", "k", 1)
	if err := holder.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	mustFindFree(t, l, "k", "a free key")
}

// With etcd cut off, Lock and Unlock fail within the Locker's Timeout with
// ErrEtcdUnavailable, and a held lock's context ends within its TTL of the
// last keepalive sent.
func TestLockFailsFastWhenEtcdIsUnreachable(t *testing.T) {
	e := startLockEtcd(t)
	p := newProxy(t, strings.TrimPrefix(e.Endpoint, "https://"))
	cli := e.client(t, "a", nil, "https://"+p.l.Addr().String())
	l := e.locker(t, cli, "a", LockerOptions{TTL: 3 * time.Second, Timeout: time.Second})
	held := mustLock(t, l, "k")
	ctx := held.Context()
	p.pause()

	start := time.Now()
	if _, err := l.Lock(context.Background(), "other"); !errors.Is(err, ErrEtcdUnavailable) {
		t.Fatalf("Lock with etcd cut off: %v, want ErrEtcdUnavailable", err)
	}
	if took := time.Since(start); took > 20*time.Second {
		t.Fatalf("Lock took %s to fail: it must be bounded by the Timeout", took)
	}
	select {
	case <-ctx.Done():
		if !errors.Is(context.Cause(ctx), ErrLockLost) {
			t.Fatalf("cause %v, want ErrLockLost", context.Cause(ctx))
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the held lock's context outlived its TTL with etcd cut off")
	}
	// The lock was lost before Unlock: that is what its caller must hear,
	// beside etcd being away.
	if err := held.Unlock(context.Background()); !errors.Is(err, ErrEtcdUnavailable) || !errors.Is(err, ErrLockLost) {
		t.Fatalf("Unlock with etcd cut off, of a lock already lost: %v, want ErrLockLost and ErrEtcdUnavailable", err)
	}
}

// A namespace's identity reaches only its own namespace's locks: etcd
// itself refuses the rest.
func TestAnotherNamespacesLocksAreRefusedByEtcd(t *testing.T) {
	e := startLockEtcd(t)
	b := e.client(t, "b", nil)
	l := e.locker(t, b, "a", LockerOptions{Timeout: 5 * time.Second})
	if _, err := l.Lock(context.Background(), "k"); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Fatalf("b locking a's key: %v, want etcd's permission denied", err)
	}
	if _, err := b.Get(context.Background(), etcdkeys.NamespaceLocksPrefix(prefix, "a"), clientv3.WithPrefix()); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Fatalf("b reading a's locks: %v, want permission denied", err)
	}
	if _, err := b.Put(context.Background(), etcdkeys.LockFloorKey(prefix), "0"); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Fatalf("b writing the lock floor: %v, want permission denied", err)
	}
}

// An uncontended Lock and Unlock cost what etcd's own Mutex costs: one
// round trip each, the session aside. (Unlock is a transaction where the
// Mutex's is a plain delete: the delete compares the key's revision.)
func TestUncontendedLockCostsWhatAMutexCosts(t *testing.T) {
	e := startLockEtcd(t)
	var ours, theirs callCounter
	l := e.locker(t, e.client(t, "a", &ours), "a", LockerOptions{})
	_ = mustLock(t, l, "warm").Unlock(context.Background()) // the session
	ours.take()
	lk := mustLock(t, l, "k")
	if err := lk.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := ours.take()

	s, err := concurrency.NewSession(e.client(t, "a", &theirs), concurrency.WithTTL(15))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	theirs.take()
	m := concurrency.NewMutex(s, etcdkeys.NamespaceLocksPrefix(prefix, "a")+"mutex")
	if err := m.Lock(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := m.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	want := theirs.take()
	if total(got) != total(want) || got["Txn"] != 2 {
		t.Fatalf("Lock+Unlock made %v, etcd's Mutex %v", got, want)
	}
	t.Logf("Lock+Unlock: %v; concurrency.Mutex: %v", got, want)
}

// After etcd went back in time, no lock is granted below the floor the
// manager sets, and the refused waiter leaves no key behind.
func TestLockRefusesBelowTheFloor(t *testing.T) {
	e := startLockEtcd(t)
	l := e.locker(t, e.client(t, "a", nil), "a", LockerOptions{})
	if _, err := e.mgr.Put(context.Background(), etcdkeys.LockFloorKey(prefix), "1000000"); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Lock(context.Background(), "k"); !errors.Is(err, ErrEtcdRegressed) {
		t.Fatalf("Lock below the floor: %v, want ErrEtcdRegressed", err)
	}
	waitForWaiters(t, e.mgr, "a", "k", 0)
	if _, err := e.mgr.Delete(context.Background(), etcdkeys.LockFloorKey(prefix)); err != nil {
		t.Fatal(err)
	}
	_ = mustLock(t, l, "k")
}

func TestLockRefusesBadKeys(t *testing.T) {
	cli := &clientv3.Client{} // never called: bad keys and options are refused first
	l, err := NewLocker(cli, prefix, "a", LockerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, keys := range [][]string{nil, {""}, {"a", "a"}, {strings.Repeat("k", etcdkeys.MaxLockKeyLen+1)}, {"\x00"}} {
		if _, err := l.Lock(context.Background(), keys...); err == nil {
			t.Errorf("Lock(%q) passed", keys)
		}
	}
	for _, opts := range []LockerOptions{{TTL: time.Second}, {Timeout: -1}} {
		if _, err := NewLocker(cli, prefix, "a", opts); err == nil {
			t.Errorf("NewLocker(%+v) passed", opts)
		}
	}
}

// A Locker that saw a higher revision than etcd now answers at (etcd
// restored from an old snapshot without --bump-revision) takes no lock,
// deletes what it queued and ends its session, before any manager notices.
func TestLockerNoticesEtcdGoneBackInTime(t *testing.T) {
	e := startLockEtcd(t)
	l := e.locker(t, e.client(t, "a", nil), "a", LockerOptions{})
	held := mustLock(t, l, "held")
	l.maxRev.Store(1 << 40) // as if etcd had answered at a far higher revision before
	if _, err := l.Lock(context.Background(), "k"); !errors.Is(err, ErrEtcdRegressed) {
		t.Fatalf("Lock after etcd went back: %v, want ErrEtcdRegressed", err)
	}
	waitForWaiters(t, e.mgr, "a", "k", 0)
	select {
	case <-held.Context().Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the session's other locks outlived the regression")
	}
	waitForWaiters(t, e.mgr, "a", "held", 0) // the session's lease was revoked
}

// One Locker shared by many goroutines: their answers arrive in any order,
// and none of them is taken for etcd going back in time.
func TestOneLockerManyGoroutines(t *testing.T) {
	e := startLockEtcd(t)
	l := e.locker(t, e.client(t, "a", nil), "a", LockerOptions{})
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			for i := range 40 {
				if !lockUnlock(t, l, fmt.Sprintf("k%d-%d", w, i%4)) {
					return
				}
			}
		})
	}
	wg.Wait()
}
