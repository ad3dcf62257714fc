package fence

import (
	"context"
	"errors"
	"testing"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-io/fencer/pkg/etcdkeys"
)

// sessionOf is l's current session lease.
func sessionOf(l *Locker) clientv3.LeaseID {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sess.id
}

// Another namespace's identity cannot find an idle Locker's session by
// counting down from a lease of its own (etcd picks IDs in sequence), so it
// can neither revoke it nor attach a key to it, which would have every
// later Lock of the namespace refused. Nor will etcd list the leases to it
// while the manager keeps a key on a lease, as its election always does.
func TestAnotherNamespaceCannotFindAnIdleSession(t *testing.T) {
	e := startLockEtcd(t)
	ctx := context.Background()
	// The manager's election: a key on a lease of its own.
	election, err := e.mgr.Grant(ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.mgr.Put(ctx, prefix+"/election/test", "m", clientv3.WithLease(election.ID)); err != nil {
		t.Fatal(err)
	}
	la := e.locker(t, e.client(t, "a", nil), "a", LockerOptions{})
	if err := mustLock(t, la, "k").Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	session := sessionOf(la) // idle now: no key on it

	b := e.client(t, "b", nil)
	if _, err := b.Leases(ctx); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Fatalf("b listing every etcd lease: %v, want permission denied", err)
	}
	own, err := b.Grant(ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	bKey := etcdkeys.DataPrefix(prefix, "b") + "squat"
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

// Close ends the locks held with ErrLockLost, as any other loss does.
func TestCloseEndsLocksWithErrLockLost(t *testing.T) {
	e := startLockEtcd(t)
	l := e.locker(t, e.client(t, "a", nil), "a", LockerOptions{})
	lk := mustLock(t, l, "k")
	if err := l.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	<-lk.Done()
	if cause := context.Cause(lk.Context()); !errors.Is(cause, ErrLockLost) {
		t.Fatalf("a held lock's context after Close: %v, want ErrLockLost", cause)
	}
	if _, err := l.Lock(context.Background(), "k"); err == nil {
		t.Fatal("Lock after Close succeeded")
	}
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
