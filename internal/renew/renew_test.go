package renew

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"k8s.io/utils/clock"

	"github.com/fencer-io/fencer/test/support/testenv"
)

// These tests run a real etcd (bin/etcd): what matters is what etcd does
// with the keepalives, on real time.

func client(t *testing.T) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{testenv.Etcd(t)}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

func grant(t *testing.T, cli *clientv3.Client, ttl int64) clientv3.LeaseID {
	t.Helper()
	l, err := cli.Grant(context.Background(), ttl)
	if err != nil {
		t.Fatal(err)
	}
	return l.ID
}

// remaining is the lease's TTL left in etcd; -1 once it expired.
func remaining(t *testing.T, cli *clientv3.Client, id clientv3.LeaseID) int64 {
	t.Helper()
	r, err := cli.TimeToLive(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return r.TTL
}

// lostKeys collects the keys reported lost.
type lostKeys struct {
	mu   sync.Mutex
	keys []string
}

func (l *lostKeys) add(key string) { l.mu.Lock(); l.keys = append(l.keys, key); l.mu.Unlock() }
func (l *lostKeys) has(key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, k := range l.keys {
		if k == key {
			return true
		}
	}
	return false
}

func TestKeepsManyLeasesAliveOnOneStream(t *testing.T) {
	cli := client(t)
	var lost lostKeys
	r := New(cli, clock.RealClock{}, lost.add)
	const n = 300
	before := runtime.NumGoroutine()
	ids := make([]clientv3.LeaseID, n)
	granted := time.Now()
	for i := range ids {
		ids[i] = grant(t, cli, 2)
		r.Ensure(fmt.Sprintf("k%d", i), ids[i], granted)
	}
	// Two goroutines in all (sender and receiver), not two per lease.
	if grew := runtime.NumGoroutine() - before; grew > 10 {
		t.Errorf("%d goroutines more for %d leases", grew, n)
	}
	time.Sleep(5 * time.Second) // two and a half TTLs
	for i, id := range ids {
		if ttl := remaining(t, cli, id); ttl <= 0 {
			t.Fatalf("lease %d expired while renewed (TTL %d)", i, ttl)
		}
		last, ok := r.LastRenew(fmt.Sprintf("k%d", i))
		if !ok || !last.After(granted.Add(3*time.Second)) {
			t.Fatalf("lease %d: last renewal %s, want within the last 2 s", i, last.Sub(granted))
		}
	}
	if r.Len() != n || len(lost.keys) != 0 {
		t.Fatalf("Len %d, lost %v", r.Len(), lost.keys)
	}
}

func TestStopLetsTheLeaseExpire(t *testing.T) {
	cli := client(t)
	r := New(cli, clock.RealClock{}, nil)
	id := grant(t, cli, 2)
	r.Ensure("k", id, time.Now())
	time.Sleep(1500 * time.Millisecond)
	last, ok := r.Stop("k")
	if !ok || time.Since(last) > 1500*time.Millisecond {
		t.Fatalf("Stop: last renewal %s ago, ok %v", time.Since(last), ok)
	}
	if r.Renewing("k", id) || r.Len() != 0 {
		t.Fatal("still renewing after Stop")
	}
	deadline := last.Add(2*time.Second + time.Second)
	for remaining(t, cli, id) > 0 {
		if time.Now().After(deadline) {
			t.Fatal("the lease outlived its TTL after Stop: a keepalive was sent after it")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestSuspendSendsNoMoreKeepalives: a suspended lease gets no keepalive,
// expires on its TTL from the last renewal before the suspension, is not
// reported lost (the caller ends it), and Stop still tells its last
// renewal. Suspending another id under the key does nothing.
func TestSuspendSendsNoMoreKeepalives(t *testing.T) {
	cli := client(t)
	var lost lostKeys
	r := New(cli, clock.RealClock{}, lost.add)
	id := grant(t, cli, 2)
	r.Ensure("k", id, time.Now())
	time.Sleep(1200 * time.Millisecond)
	if r.Suspend("k", id+1) {
		t.Fatal("suspended a lease the key is not renewed under")
	}
	if !r.Suspend("k", id) || r.Suspend("k", id) {
		t.Fatal("Suspend: want true once, then false")
	}
	suspended := time.Now()
	if r.Renewing("k", id) {
		t.Fatal("Renewing after Suspend")
	}
	for remaining(t, cli, id) > 0 {
		if time.Since(suspended) > 2*time.Second+time.Second {
			t.Fatal("the lease outlived its TTL after Suspend: a keepalive was sent after it")
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(1500 * time.Millisecond) // past a reap
	if lost.has("k") {
		t.Fatal("a suspended lease was reported lost: ending it is the caller's")
	}
	last, ok := r.Stop("k")
	if !ok || last.After(suspended) {
		t.Fatalf("Stop after Suspend: last renewal %s, suspended %s, ok %v", last, suspended, ok)
	}
}

// TestEnsureResumesASuspendedLease: the holder qualified again before the
// reconcile ended its tenure; renewal resumes at once.
func TestEnsureResumesASuspendedLease(t *testing.T) {
	cli := client(t)
	r := New(cli, clock.RealClock{}, nil)
	id := grant(t, cli, 2)
	r.Ensure("k", id, time.Now())
	time.Sleep(700 * time.Millisecond)
	r.Suspend("k", id)
	time.Sleep(700 * time.Millisecond)
	r.Ensure("k", id, time.Now())
	if !r.Renewing("k", id) {
		t.Fatal("not renewing after Ensure resumed it")
	}
	time.Sleep(3 * time.Second) // past the TTL of any renewal before the suspension
	if remaining(t, cli, id) <= 0 {
		t.Fatal("the resumed lease expired")
	}
}

// TestResumeNeverStartsALease: Resume restarts only a suspended lease;
// after Stop, or for an id the key is not renewed under, it does nothing.
func TestResumeNeverStartsALease(t *testing.T) {
	cli := client(t)
	r := New(cli, clock.RealClock{}, nil)
	id := grant(t, cli, 30)
	if r.Resume("k", id) || r.Len() != 0 {
		t.Fatal("Resume started renewing a lease that was never renewed")
	}
	r.Ensure("k", id, time.Now())
	if r.Resume("k", id) {
		t.Fatal("Resume reported resuming a lease that was not suspended")
	}
	r.Suspend("k", id)
	if !r.Suspended("k") || r.Resume("k", id+1) || !r.Resume("k", id) || !r.Renewing("k", id) {
		t.Fatal("Resume: want it to resume the suspended id only")
	}
	r.Suspend("k", id)
	r.Stop("k")
	if r.Resume("k", id) || r.Renewing("k", id) {
		t.Fatal("Resume brought back a lease that Stop ended")
	}
}

func TestRevokedLeaseIsReportedLost(t *testing.T) {
	cli := client(t)
	var lost lostKeys
	r := New(cli, clock.RealClock{}, lost.add)
	kept, revoked := grant(t, cli, 2), grant(t, cli, 2)
	r.Ensure("kept", kept, time.Now())
	r.Ensure("revoked", revoked, time.Now())
	time.Sleep(time.Second)
	if _, err := cli.Revoke(context.Background(), revoked); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(3 * time.Second); !lost.has("revoked"); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("a revoked lease was not reported lost")
		}
	}
	if lost.has("kept") || !r.Renewing("kept", kept) || r.Renewing("revoked", revoked) {
		t.Fatalf("lost %v; renewing kept %v", lost.keys, r.Renewing("kept", kept))
	}
}

func TestUnknownLeaseIsReportedLost(t *testing.T) {
	cli := client(t)
	var lost lostKeys
	r := New(cli, clock.RealClock{}, lost.add)
	r.Ensure("ghost", clientv3.LeaseID(0x7fff0000), time.Now())
	for deadline := time.Now().Add(3 * time.Second); !lost.has("ghost"); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("a lease etcd does not have was not reported lost")
		}
	}
}

func TestEnsureReplacesAKeysLease(t *testing.T) {
	cli := client(t)
	r := New(cli, clock.RealClock{}, nil)
	old, next := grant(t, cli, 2), grant(t, cli, 2)
	r.Ensure("k", old, time.Now())
	time.Sleep(500 * time.Millisecond)
	r.Ensure("k", next, time.Now())
	if !r.Renewing("k", next) || r.Renewing("k", old) || r.Len() != 1 {
		t.Fatal("Ensure with a new id did not replace the old one")
	}
	time.Sleep(3500 * time.Millisecond)
	if remaining(t, cli, old) > 0 {
		t.Error("the replaced lease is still renewed")
	}
	if remaining(t, cli, next) <= 0 {
		t.Error("the new lease expired")
	}
	r.StopAll()
	if r.Len() != 0 {
		t.Error("StopAll left leases")
	}
}

func TestClosedClientReportsEveryLeaseLost(t *testing.T) {
	cli := client(t)
	var lost lostKeys
	r := New(cli, clock.RealClock{}, lost.add)
	r.Ensure("a", grant(t, cli, 5), time.Now())
	r.Ensure("b", grant(t, cli, 5), time.Now())
	time.Sleep(500 * time.Millisecond)
	_ = cli.Close()
	for deadline := time.Now().Add(3 * time.Second); !lost.has("a") || !lost.has("b"); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("after the client closed, lost only %v", lost.keys)
		}
	}
	if r.Len() != 0 {
		t.Error("leases still listed as renewed after the client closed")
	}
}
