package fence

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/fencer-io/fencer/internal/identity"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
)

// sessionOf is l's current session lease.
func sessionOf(l *Locker) clientv3.LeaseID {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sess.id
}

// Another namespace's identity can neither list, revoke nor attach a key
// to an idle Locker's session, even knowing its ID, and even with no other
// key on any lease (no manager leads): the session's marker key is the
// namespace's own. Nor can it find the ID by counting down from a lease
// of its own (etcd picks IDs in sequence) in the moment before the marker.
func TestAnotherNamespaceCannotFindAnIdleSession(t *testing.T) {
	e := startLockEtcd(t)
	ctx := context.Background()
	la := e.locker(t, e.client(t, "a", nil), "a", LockerOptions{Pod: "a-0"})
	if err := mustLock(t, la, "k").Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	session := sessionOf(la) // idle now: only its marker is on it
	keys, err := e.mgr.Get(ctx, etcdkeys.LocksPrefix(prefix), clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if len(keys.Kvs) != 1 || string(keys.Kvs[0].Key) != etcdkeys.LockSessionKey(prefix, "a", int64(session)) || keys.Kvs[0].Lease != int64(session) {
		t.Fatalf("keys under the locks prefix of an idle Locker: %v, want only its session's marker, on its lease", keys.Kvs)
	}

	b := e.client(t, "b", nil)
	if _, err := b.Leases(ctx); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Fatalf("b listing every etcd lease with no manager's key live: %v, want permission denied", err)
	}
	bKey := etcdkeys.DataPrefix(prefix, "b") + "squat"
	if _, err := b.Put(ctx, bKey, "x", clientv3.WithLease(session)); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Fatalf("b attaching a key to a's idle session: %v, want permission denied", err)
	}
	if _, err := b.Revoke(ctx, session); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Fatalf("b revoking a's idle session: %v, want permission denied", err)
	}
	own, err := b.Grant(ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	for id := own.ID - 1; id > own.ID-200; id-- {
		if id == session {
			t.Fatalf("a's session lease %x is %d below b's own", int64(session), own.ID-id)
		}
		if _, err := b.Put(ctx, bKey, "x", clientv3.WithLease(id)); err == nil {
			t.Fatalf("b attached a key to lease %x, %d below its own: someone's session", int64(id), own.ID-id)
		}
	}
	if err := mustLock(t, la, "k").Unlock(ctx); err != nil {
		t.Fatalf("a's Lock after b's search: %v", err)
	}
	if sessionOf(la) != session {
		t.Fatalf("a's session changed from %x to %x", int64(session), int64(sessionOf(la)))
	}
}

// A Locker whose etcd is out of reach when its session starts waits for
// it, as clientv3's own calls do, rather than fail the Lock at once.
func TestASessionStartWaitsForEtcd(t *testing.T) {
	e := startLockEtcd(t)
	p := newProxy(t, strings.TrimPrefix(e.Endpoint, "https://"))
	p.pause()
	cli := e.client(t, "a", nil, "https://"+p.l.Addr().String())
	l := e.locker(t, cli, "a", LockerOptions{Timeout: 20 * time.Second})
	locked := make(chan error, 1)
	go func() {
		lk, err := l.Lock(context.Background(), "k")
		if err == nil {
			err = lk.Unlock(context.Background())
		}
		locked <- err
	}()
	time.Sleep(time.Second) // the first dial and grant find nobody
	p.resume()
	if err := <-locked; err != nil {
		t.Fatalf("Lock while etcd came back within its Timeout: %v", err)
	}
}

// etcd's own refusals for being unavailable (no leader, a request timed
// out) reach the caller as clientv3's rpctypes errors, not gRPC statuses:
// they are still ErrEtcdUnavailable, and still worth a retry.
func TestEtcdsUnavailableErrorsAreUnreachable(t *testing.T) {
	for _, err := range []error{rpctypes.ErrNoLeader, rpctypes.ErrTimeout, rpctypes.ErrGRPCNoLeader, fmt.Errorf("wrapped: %w", rpctypes.ErrLeaderChanged)} {
		if !unreachable(err) {
			t.Errorf("%v is not taken as etcd out of reach", err)
		}
	}
	if !transient(rpctypes.ErrTooManyRequests) {
		t.Errorf("%v is not taken as worth a retry", rpctypes.ErrTooManyRequests)
	}
	for _, err := range []error{rpctypes.ErrPermissionDenied, rpctypes.ErrLeaseNotFound, errors.New("x")} {
		if unreachable(err) {
			t.Errorf("%v is taken as etcd out of reach", err)
		}
	}
}

// A client without a gRPC connection of its own (clientv3.NewCtxClient,
// as an embedded etcd's in-process client is) still takes locks, under a
// lease etcd numbers, closed by its marker; a client with nothing behind
// it is refused with an error that says so, not a panic.
func TestALockerWithoutItsOwnConnection(t *testing.T) {
	e := startLockEtcd(t)
	ctx := context.Background()
	real := e.client(t, "a", nil)
	inProcess := clientv3.NewCtxClient(ctx)
	inProcess.KV, inProcess.Lease, inProcess.Watcher = real.KV, real.Lease, real.Watcher
	l := e.locker(t, inProcess, "a", LockerOptions{})
	if err := mustLock(t, l, "k").Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	marker, err := e.mgr.Get(ctx, etcdkeys.LockSessionKey(prefix, "a", int64(sessionOf(l))))
	if err != nil || len(marker.Kvs) != 1 {
		t.Fatalf("the session's marker: %v %v", marker, err)
	}

	zero := e.locker(t, &clientv3.Client{}, "a", LockerOptions{})
	if _, err := zero.Lock(ctx, "k"); !errors.Is(err, errNoConnection) {
		t.Fatalf("Lock through a zero client: %v, want %v", err, errNoConnection)
	}
}

// A lock whose session etcd refuses to renew (a key the namespace may not
// write was put on its lease, by an administrator) ends at the next
// keepalive, naming etcd's refusal, rather than a TTL later as if etcd
// were out of reach.
func TestARefusedKeepaliveEndsTheLock(t *testing.T) {
	e := startLockEtcd(t)
	ctx := context.Background()
	l := e.locker(t, e.client(t, "a", nil), "a", LockerOptions{TTL: 6 * time.Second})
	lk := mustLock(t, l, "k")
	if _, err := e.mgr.Put(ctx, etcdkeys.DataPrefix(prefix, "b")+"squat", "x", clientv3.WithLease(sessionOf(l))); err != nil {
		t.Fatal(err)
	}
	<-lk.Done()
	cause := context.Cause(lk.Context())
	if !errors.Is(cause, ErrLockLost) || !errors.Is(cause, rpctypes.ErrPermissionDenied) || errors.Is(cause, ErrEtcdUnavailable) {
		t.Fatalf("the lock ended with %v, want ErrLockLost naming etcd's permission denied", cause)
	}
}

// A session etcd refuses puts under (its lease revoked, or carrying a key
// the namespace may not write) is given up: that Lock fails with
// ErrLockLost, naming etcd's refusal, and the next one starts a new
// session and succeeds.
func TestASessionEtcdRefusesIsReplaced(t *testing.T) {
	e := startLockEtcd(t)
	ctx := context.Background()
	la := e.locker(t, e.client(t, "a", nil), "a", LockerOptions{})
	for _, spoil := range []struct {
		name string
		do   func(clientv3.LeaseID) error
		want error
	}{
		{"another namespace's key on it", func(id clientv3.LeaseID) error {
			_, err := e.mgr.Put(ctx, etcdkeys.DataPrefix(prefix, "b")+"squat", "x", clientv3.WithLease(id))
			return err
		}, rpctypes.ErrPermissionDenied},
		{"revoked", func(id clientv3.LeaseID) error { _, err := e.mgr.Revoke(ctx, id); return err }, nil},
	} {
		if err := mustLock(t, la, "k").Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		old := sessionOf(la)
		if err := spoil.do(old); err != nil {
			t.Fatalf("%s: %v", spoil.name, err)
		}
		// A revoked session may be noticed by its keepalive first; the
		// Lock then starts a new session at once.
		lk, err := la.Lock(ctx, "k")
		switch {
		case err == nil:
			if spoil.want != nil || sessionOf(la) == old {
				t.Fatalf("%s: Lock succeeded under the spoiled session %x", spoil.name, int64(old))
			}
		case !errors.Is(err, ErrLockLost) || (spoil.want != nil && !errors.Is(err, spoil.want)):
			t.Fatalf("%s: Lock: %v, want ErrLockLost naming etcd's refusal (%v)", spoil.name, err, spoil.want)
		default:
			if lk, err = la.Lock(ctx, "k"); err != nil {
				t.Fatalf("%s: the Lock after: %v", spoil.name, err)
			}
			if sessionOf(la) == old {
				t.Fatalf("%s: still session %x", spoil.name, int64(old))
			}
		}
		if err := lk.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// Close ends the locks held with ErrLockLost, as any other loss does; a
// Lock still waiting for its turn, which never held it, and a Lock after
// Close fail with ErrLockerClosed.
func TestCloseEndsLocksWithErrLockLost(t *testing.T) {
	e := startLockEtcd(t)
	l := e.locker(t, e.client(t, "a", nil), "a", LockerOptions{})
	lk := mustLock(t, l, "k")
	waiting := make(chan error, 1)
	go func() { _, err := l.Lock(context.Background(), "k"); waiting <- err }()
	waitForWaiters(t, e.mgr, "a", "k", 2)
	if err := l.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	<-lk.Done()
	if cause := context.Cause(lk.Context()); !errors.Is(cause, ErrLockLost) {
		t.Fatalf("a held lock's context after Close: %v, want ErrLockLost", cause)
	}
	if err := <-waiting; !errors.Is(err, ErrLockerClosed) || errors.Is(err, ErrLockLost) {
		t.Fatalf("a Lock waiting at Close: %v, want ErrLockerClosed and not ErrLockLost", err)
	}
	if _, err := l.Lock(context.Background(), "k"); !errors.Is(err, ErrLockerClosed) {
		t.Fatalf("Lock after Close: %v, want ErrLockerClosed", err)
	}
}

// Close is safe to call twice, and after etcd has already ended the
// session: the locks are gone either way, and a deferred Close after an
// explicit one must not report etcd's "lease not found" as a failure.
func TestCloseTwiceAndAfterTheSessionExpired(t *testing.T) {
	e := startLockEtcd(t)
	ctx := context.Background()
	l := e.locker(t, e.client(t, "a", nil), "a", LockerOptions{})
	mustLock(t, l, "k")
	for i := range 2 {
		if err := l.Close(ctx); err != nil {
			t.Fatalf("Close #%d: %v", i+1, err)
		}
	}

	gone := e.locker(t, e.client(t, "a", nil), "a", LockerOptions{})
	lk := mustLock(t, gone, "k")
	if _, err := e.mgr.Revoke(ctx, sessionOf(gone)); err != nil {
		t.Fatal(err)
	}
	<-lk.Done()
	if err := gone.Close(ctx); err != nil {
		t.Fatalf("Close of a session etcd had ended: %v", err)
	}
}

// A Lock racing Close fails with ErrLockerClosed, not with ErrLockLost
// (nor ErrLockBusy) and not with a Lock: it never held. The Lock's nth transaction is held
// back, and reaches etcd either after Close's revoke (its queueing, its
// look at the queue) or after Close began but before the revoke (the look
// that finds its turn has come).
func TestLockRacingCloseFailsWithErrLockerClosed(t *testing.T) {
	e := startLockEtcd(t)
	for i, step := range []struct {
		name         string
		txn          int           // which of the Lock's transactions is held back
		beforeRevoke bool          // let it reach etcd as Close's revoke is sent
		try          time.Duration // a TryLock's wait, run out before Close
	}{
		{"queueing", 1, false, 0},
		{"looking at the queue", 2, false, 0},
		{"finding its turn came", 2, true, 0},
		{"a TryLock whose wait ran out", 2, false, 100 * time.Millisecond},
	} {
		held := &txnHolder{}
		opts := LockerOptions{Timeout: time.Minute} // a held Txn must not time out
		l := e.locker(t, e.dial(t, "a", []string{e.Endpoint}, grpc.WithChainUnaryInterceptor(held.intercept)), "a", opts)
		other := e.locker(t, e.client(t, "a", nil), "a", opts)
		mustLock(t, l, "warm") // the session
		key := fmt.Sprintf("k%d", i)
		ahead := mustLock(t, other, key)
		arrived, release := held.hold(step.txn, step.beforeRevoke)
		t.Cleanup(release)
		failed := make(chan error, 1)
		go func() {
			lock := l.Lock
			if step.try > 0 {
				lock = func(ctx context.Context, keys ...string) (*Lock, error) { return l.TryLock(ctx, step.try, keys...) }
			}
			lk, err := lock(context.Background(), key)
			if err == nil {
				err = fmt.Errorf("a Lock with token %d", lk.Token(key).Value)
			}
			failed <- err
		}()
		select {
		case <-arrived:
		case err := <-failed:
			t.Fatalf("%s: the Lock ended before its transaction %d: %v", step.name, step.txn, err)
		}
		time.Sleep(2 * step.try)
		if step.beforeRevoke {
			if err := ahead.Unlock(context.Background()); err != nil { // its turn comes
				t.Fatal(err)
			}
		}
		if err := l.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		release()
		if err := <-failed; !errors.Is(err, ErrLockerClosed) || errors.Is(err, ErrLockLost) {
			t.Fatalf("%s at Close: %v, want ErrLockerClosed and not ErrLockLost", step.name, err)
		}
	}
}

// A TryLock whose session is lost while it queues for a free key fails
// with the loss, not ErrLockBusy: the key was free, and the wait that ran
// out (none, here) is not why it did not hold.
func TestTryLockOnALostSessionIsNotBusy(t *testing.T) {
	e := startLockEtcd(t)
	held := &txnHolder{}
	l := e.locker(t, e.dial(t, "a", []string{e.Endpoint}, grpc.WithChainUnaryInterceptor(held.intercept)), "a", LockerOptions{Timeout: time.Minute})
	if err := mustLock(t, l, "warm").Unlock(context.Background()); err != nil { // the session
		t.Fatal(err)
	}
	arrived, release := held.hold(1, false)
	t.Cleanup(release)
	failed := make(chan error, 1)
	go func() {
		lk, err := l.TryLock(context.Background(), 0, "free")
		if err == nil {
			err = fmt.Errorf("a Lock with token %d", lk.Token("free").Value)
		}
		failed <- err
	}()
	select { // its queueing is on its way; the session is lost meanwhile
	case <-arrived:
	case err := <-failed:
		t.Fatalf("TryLock ended before its queueing: %v", err)
	}
	l.mu.Lock()
	l.sess.lose(errors.New("test: the session's keepalive failed"))
	l.mu.Unlock()
	release()
	if err := <-failed; !errors.Is(err, ErrLockLost) || errors.Is(err, ErrLockBusy) {
		t.Fatalf("TryLock on a free key whose session was lost: %v, want ErrLockLost and not ErrLockBusy", err)
	}
}

// txnHolder holds back the nth Txn after hold is called: until release,
// or, with beforeRevoke, until a LeaseRevoke is sent, which then waits
// for the Txn's answer before it goes on.
type txnHolder struct {
	mu           sync.Mutex
	left         int
	beforeRevoke bool
	arrived      chan struct{}
	release      chan struct{}
	answered     chan struct{}
	releaseOnce  func()
}

func (h *txnHolder) hold(nth int, beforeRevoke bool) (arrived <-chan struct{}, release func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.left, h.beforeRevoke = nth, beforeRevoke
	h.arrived, h.release, h.answered = make(chan struct{}), make(chan struct{}), make(chan struct{})
	h.releaseOnce = sync.OnceFunc(func() { close(h.release) })
	return h.arrived, h.releaseOnce
}

func (h *txnHolder) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	h.mu.Lock()
	var held bool
	switch {
	case strings.HasSuffix(method, "/Txn") && h.left > 0:
		h.left--
		if held = h.left == 0; held {
			close(h.arrived)
		}
	case strings.HasSuffix(method, "/LeaseRevoke") && h.beforeRevoke && h.left == 0:
		h.beforeRevoke = false
		h.mu.Unlock()
		h.releaseOnce()
		<-h.answered
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	h.mu.Unlock()
	if !held {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	<-h.release
	defer close(h.answered)
	return invoker(ctx, method, req, reply, cc, opts...)
}

func TestNewLockerRefusesWhatIsNoLocker(t *testing.T) {
	cli := &clientv3.Client{}
	for _, c := range []struct {
		name string
		cli  *clientv3.Client
		ns   string
	}{
		{"no client", nil, "a"},
		{"no namespace", cli, ""},
		{"a namespace with a slash", cli, "a/b"},
		{"a namespace in capitals", cli, "Team"},
	} {
		if l, err := NewLocker(c.cli, prefix, c.ns, LockerOptions{}); err == nil {
			_ = l
			t.Errorf("%s: NewLocker accepted it", c.name)
		}
	}
}

// Locks that all need a session while etcd is out of reach each fail
// within about one Timeout, not one after another: a single grant runs at
// a time, and every caller waits for it only as long as its own context
// lets it.
func TestConcurrentLocksShareOneSessionGrant(t *testing.T) {
	e := startLockEtcd(t)
	p := newProxy(t, strings.TrimPrefix(e.Endpoint, "https://"))
	p.pause()
	cli := e.client(t, "a", nil, "https://"+p.l.Addr().String())
	const n, timeout = 6, 2 * time.Second
	l := e.locker(t, cli, "a", LockerOptions{Timeout: timeout})
	start := time.Now()
	errs := make(chan error, n)
	for range n {
		go func() { _, err := l.Lock(context.Background(), "k"); errs <- err }()
	}
	for range n {
		if err := <-errs; !errors.Is(err, ErrEtcdUnavailable) {
			t.Fatalf("Lock with etcd cut off: %v, want ErrEtcdUnavailable", err)
		}
	}
	// One after another they would take n Timeouts (12 s).
	if took := time.Since(start); took > 3*timeout {
		t.Fatalf("%d concurrent Locks took %s to fail, Timeout %s: their grants queued", n, took, timeout)
	}
	// A caller's own deadline, shorter than the Timeout, running out while
	// the grant waits for etcd reads as etcd's absence too, as it does when
	// it runs out while queueing.
	short, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := l.Lock(short, "k"); !errors.Is(err, ErrEtcdUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock whose own deadline ran out during the grant: %v, want ErrEtcdUnavailable and DeadlineExceeded", err)
	}
}

// Hold does not give up a lease whose renewal etcd refuses as not
// permitted for a moment: a grant can reach its holder before the manager
// has given the namespace's role its key.
func TestHoldOutlastsARoleNotYetGranted(t *testing.T) {
	e := startLockEtcd(t)
	ctx := context.Background()
	g, err := e.mgr.Grant(ctx, 6)
	if err != nil {
		t.Fatal(err)
	}
	tok := putGrant(t, e.mgr, "a", "job", `{"holder":"p"}`, g.ID)
	held, err := Hold(ctx, e.client(t, "a", nil), prefix, "a", Token{Lease: "job", Value: tok, LeaseID: int64(g.ID)})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // the first renewals are refused
	if err := identity.EnsureNamespace(ctx, e.mgr, prefix, "a", "uid-a", []string{"job"}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	if held.Err() != nil {
		t.Fatalf("Hold gave up while the role caught up, TTL 6 s: %v", context.Cause(held))
	}
}

// Hold called late in its lease's TTL, whose renewals etcd refuses and
// which is then cut off from etcd, ends no later than etcd expires the
// lease: it counts the TTL from what etcd said was left of it, not from
// the call (which outlived etcd's expiry by the part of the TTL gone
// before the call: 3.5 s here).
func TestHoldCalledLateEndsByEtcdsExpiry(t *testing.T) {
	e := startLockEtcd(t)
	ctx := context.Background()
	g, err := e.mgr.Grant(ctx, 6)
	if err != nil {
		t.Fatal(err)
	}
	key := etcdkeys.LeaseKey(prefix, "a", "job")
	tok := putGrant(t, e.mgr, "a", "job", `{"holder":"p"}`, g.ID)
	time.Sleep(4 * time.Second) // two thirds of the TTL gone
	p := newProxy(t, strings.TrimPrefix(e.Endpoint, "https://"))
	cli := e.client(t, "a", nil, "https://"+p.l.Addr().String())
	held, err := Hold(ctx, cli, prefix, "a", Token{Lease: "job", Value: tok, LeaseID: int64(g.ID)})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // its renewals are refused: no role for the key yet
	p.pause()                          // and then it is cut off: no watch sees the expiry either
	for {
		r, err := e.mgr.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Kvs) == 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	expired := time.Now()
	select {
	case <-held.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Hold never ended")
	}
	// A little slack for the scheduler only: the old code ended 3.5 s late.
	if late := time.Since(expired); late > 500*time.Millisecond {
		t.Fatalf("Hold still held %s after etcd expired the lease (%v)", late, context.Cause(held))
	}
	if !errors.Is(context.Cause(held), ErrLeaseLost) {
		t.Fatalf("cause %v, want ErrLeaseLost", context.Cause(held))
	}
}

// renewedAt never starts Hold's clock after the moment it asked etcd,
// whatever etcd (or something posing as it) answered for the remaining
// TTL: etcd before v3.5.14 could answer 292 years from a demoted lessor.
func TestRenewedAtIsNeverAfterTheQuestion(t *testing.T) {
	asked := time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)
	ttl := 6 * time.Second
	for _, c := range []struct {
		remaining int64
		want      time.Time
	}{
		{2, asked.Add(-4 * time.Second)},
		{6, asked},
		{7, asked},
		{int64(time.Duration(math.MaxInt64).Seconds()), asked},
		{-1, asked.Add(-ttl)},
	} {
		if got := renewedAt(asked, c.remaining, ttl); !got.Equal(c.want) {
			t.Errorf("remaining %d s of a %s TTL: %s, want %s", c.remaining, ttl, got, c.want)
		}
	}
}
