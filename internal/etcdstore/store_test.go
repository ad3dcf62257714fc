package etcdstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/fencer-io/fencer/internal/etcdreply"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
	"github.com/fencer-io/fencer/test/support/testenv"
)

// startEtcd runs a real etcd from bin/ for the test.
func startEtcd(t testing.TB, extraArgs ...string) *clientv3.Client {
	t.Helper()
	cli, err := Connect(Config{Endpoints: []string{testenv.Etcd(t, extraArgs...)}, Prefix: DefaultPrefix, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// win campaigns for the leader key with its own session and returns an
// Elector holding that term, plus the session so the test can kill it.
func win(t *testing.T, cli *clientv3.Client, name string) (*Elector, *concurrency.Session) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := concurrency.NewSession(cli, concurrency.WithTTL(5))
	if err != nil {
		t.Fatal(err)
	}
	el := concurrency.NewElection(s, etcdkeys.LeaderKey(DefaultPrefix))
	if err := el.Campaign(ctx, name); err != nil {
		t.Fatal(err)
	}
	e := NewElector(cli, DefaultPrefix, name, time.Second)
	e.setTerm(&Term{Key: el.Key(), Rev: el.Rev()})
	return e, s
}

func TestGrantTokenIsCreateRevisionAndReleaseIsConditional(t *testing.T) {
	cli := startEtcd(t)
	ctx := context.Background()
	e, _ := win(t, cli, "a")
	s := NewStore(cli, DefaultPrefix, e, nil)

	g, err := s.GrantLease(ctx, "ns", "l", "lease-uid", "pod-a", "uid-a", 10*time.Second, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Get(ctx, etcdkeys.LeaseKey(DefaultPrefix, "ns", "l"))
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("key not written: %v %v", resp, err)
	}
	if kv := resp.Kvs[0]; kv.CreateRevision != g.Token || clientv3.LeaseID(kv.Lease) != g.LeaseID {
		t.Fatalf("token %d / lease %d, but the key has CreateRevision %d / lease %d", g.Token, g.LeaseID, kv.CreateRevision, kv.Lease)
	}
	if _, err := s.GrantLease(ctx, "ns", "l", "lease-uid", "pod-b", "uid-b", 10*time.Second, time.Now()); !errors.Is(err, ErrHeld) {
		t.Fatalf("second grant: %v, want ErrHeld", err)
	}
	got, err := s.GetGrant(ctx, "ns", "l")
	if err != nil || got.Token != g.Token || got.Holder != "pod-a" || got.LeaseID != g.LeaseID {
		t.Fatalf("GetGrant = %+v, %v", got, err)
	}

	stale := *g
	stale.Token--
	if err := s.Release(ctx, "ns", "l", &stale); !errors.Is(err, ErrTokenMismatch) {
		t.Fatalf("release with a stale token: %v, want ErrTokenMismatch", err)
	}
	if err := s.Release(ctx, "ns", "l", g); err != nil {
		t.Fatal(err)
	}
	if got, err := s.GetGrant(ctx, "ns", "l"); err != nil || got != nil {
		t.Fatalf("after release: %+v, %v", got, err)
	}
	// The revoke runs in the background, after the delete.
	waitRevoked(t, s, g)
	g2, err := s.GrantLease(ctx, "ns", "l", "lease-uid", "pod-b", "uid-b", 10*time.Second, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if g2.Token <= g.Token {
		t.Fatalf("second token %d not above first %d", g2.Token, g.Token)
	}
}

// While the lock floor key exists (etcd went back in time), no Lease is
// granted, and the refusal says so, with the floor; a deleted Lease's
// refusal is still ErrLeaseDeleted, and once the floor goes, the grant is
// made.
func TestGrantRefusedAtTheLockFloor(t *testing.T) {
	cli := startEtcd(t)
	ctx := context.Background()
	e, _ := win(t, cli, "a")
	s := NewStore(cli, DefaultPrefix, e, nil)
	floor := etcdkeys.LockFloorKey(DefaultPrefix)
	if _, err := cli.Put(ctx, floor, "5000"); err != nil {
		t.Fatal(err)
	}
	var below *RevisionFloorError
	if _, err := s.GrantLease(ctx, "ns", "l", "lease-uid", "pod-a", "uid-a", 10*time.Second, time.Now()); !errors.As(err, &below) || below.Floor != "5000" {
		t.Fatalf("grant below the floor: %v, want a RevisionFloorError naming 5000", err)
	}
	if g, err := s.GetGrant(ctx, "ns", "l"); err != nil || g != nil {
		t.Fatalf("after the refusal: %+v, %v; want no grant", g, err)
	}
	if _, err := cli.Put(ctx, etcdkeys.DeletedLeaseKey(DefaultPrefix, "ns", "gone", "gone-uid"), "x"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GrantLease(ctx, "ns", "gone", "gone-uid", "pod-a", "uid-a", 10*time.Second, time.Now()); !errors.Is(err, ErrLeaseDeleted) {
		t.Fatalf("grant of a deleted Lease below the floor: %v, want ErrLeaseDeleted", err)
	}
	if _, err := cli.Delete(ctx, floor); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GrantLease(ctx, "ns", "l", "lease-uid", "pod-a", "uid-a", 10*time.Second, time.Now()); err != nil {
		t.Fatalf("grant once the floor is gone: %v", err)
	}
}

// TestDeposedControllerCannotGrant: a replica whose election key was
// superseded still believes it leads, and every write it tries is refused by
// etcd itself.
func TestDeposedControllerCannotGrant(t *testing.T) {
	cli := startEtcd(t)
	ctx := context.Background()
	old, oldSession := win(t, cli, "old")
	oldStore := NewStore(cli, DefaultPrefix, old, nil)
	g, err := oldStore.GrantLease(ctx, "ns", "held", "lease-uid", "pod-a", "uid-a", 30*time.Second, time.Now())
	if err != nil {
		t.Fatal(err)
	}

	// The old leader's session ends (as when it is partitioned past its TTL)
	// and another replica wins. The old Elector is never told.
	if _, err := cli.Revoke(ctx, oldSession.Lease()); err != nil {
		t.Fatal(err)
	}
	nu, _ := win(t, cli, "new")
	if _, err := old.Term(); err != nil {
		t.Fatal("the old elector must still believe it leads for this test to mean anything")
	}

	if _, err := oldStore.GrantLease(ctx, "ns", "other", "lease-uid", "pod-b", "uid-b", 30*time.Second, time.Now()); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("deposed grant: %v, want ErrNotLeader", err)
	}
	if err := oldStore.Release(ctx, "ns", "held", g); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("deposed release: %v, want ErrNotLeader", err)
	}
	if got, _ := oldStore.GetGrant(ctx, "ns", "other"); got != nil {
		t.Fatalf("deposed controller wrote a grant: %+v", got)
	}
	next := etcdkeys.IDRangeNextKey(DefaultPrefix, "ns", "ids")
	if _, err := cli.Put(ctx, next, "1001"); err != nil {
		t.Fatal(err)
	}
	if err := oldStore.DeleteNext(ctx, "ns", "ids"); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("deposed DeleteNext: %v, want ErrNotLeader", err)
	}
	if resp, err := cli.Get(ctx, next); err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("a deposed controller deleted an IDRange's next key: %v %v", resp, err)
	}
	// A range recreated under the name: its slot, leased by the new leader,
	// survives the deposed leader's release, and a listing of an earlier
	// lease of the slot (another token) releases nothing either.
	newStore := NewStore(cli, DefaultPrefix, nu, nil)
	sl, err := newStore.LeaseSlot(ctx, "ns", "ids", 0, 3, nil, "pod-b", "uid-b", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	earlier := *sl
	earlier.Token--
	if err := oldStore.ReleaseSlots(ctx, "ns", "ids", []Slot{*sl}); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("deposed ReleaseSlots: %v, want ErrNotLeader", err)
	}
	if err := newStore.ReleaseSlots(ctx, "ns", "ids", []Slot{earlier}); err != nil {
		t.Fatal(err)
	}
	if live, err := newStore.Slots(ctx, "ns", "ids"); err != nil || len(live) != 1 || live[0].Token != sl.Token {
		t.Fatalf("slots after two releases that must not take it: %+v, %v", live, err)
	}
	if err := newStore.ReleaseSlots(ctx, "ns", "ids", []Slot{*sl}); err != nil {
		t.Fatal(err)
	}
	if live, err := newStore.Slots(ctx, "ns", "ids"); err != nil || len(live) != 0 {
		t.Fatalf("the leader's release left %+v, %v", live, err)
	}
	if err := newStore.DeleteNext(ctx, "ns", "ids"); err != nil {
		t.Fatal(err)
	}
	if resp, err := cli.Get(ctx, next); err != nil || len(resp.Kvs) != 0 {
		t.Fatalf("the leader's DeleteNext left the key: %v %v", resp, err)
	}
	if _, err := newStore.GrantLease(ctx, "ns", "other", "lease-uid", "pod-b", "uid-b", 30*time.Second, time.Now()); err != nil {
		t.Fatalf("the new leader cannot grant: %v", err)
	}
	if err := newStore.Release(ctx, "ns", "held", g); err != nil {
		t.Fatalf("the new leader cannot release an adopted grant: %v", err)
	}
}

func TestElectorResignsOnStop(t *testing.T) {
	cli := startEtcd(t)
	e := NewElector(cli, DefaultPrefix, "a", 5*time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = e.Start(ctx); close(done) }()
	waitTerm(t, e)
	cancel()
	<-done
	if _, err := e.Term(); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("stopped elector still leads: %v", err)
	}
	// Resigning deletes the key at once, so a successor need not wait 5s.
	resp, err := cli.Get(context.Background(), etcdkeys.LeaderKey(DefaultPrefix), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || resp.Count != 0 {
		t.Fatalf("leader key left behind after stop: count %d, %v", resp.Count, err)
	}
}

func waitTerm(t *testing.T, e *Elector) Term {
	t.Helper()
	for range 300 {
		if term, err := e.Term(); err == nil {
			return term
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatal("elector never won")
	return Term{}
}

// A lease key re-created by anyone but GrantLease (same value, same etcd
// lease, new CreateRevision) reads as Unissued, and as no grant at all to
// the webhook's live reads.
func TestRecreatedLeaseKeyReadsAsUnissued(t *testing.T) {
	cli := startEtcd(t)
	el, _ := win(t, cli, "c1")
	s := NewStore(cli, DefaultPrefix, el, nil)
	ctx := context.Background()
	g, err := s.GrantLease(ctx, "ns", "job", "lease-uid", "p", "uid", 30*time.Second, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	got, _, err := s.ReadGrant(ctx, "ns", "job")
	if err != nil || got == nil || got.Unissued || got.Token != g.Token {
		t.Fatalf("the controller's own grant: %+v, %v", got, err)
	}
	key := etcdkeys.LeaseKey(DefaultPrefix, "ns", "job")
	resp, err := cli.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, key, string(resp.Kvs[0].Value), clientv3.WithLease(g.LeaseID)); err != nil {
		t.Fatal(err)
	}
	got, _, err = s.ReadGrant(ctx, "ns", "job")
	if err != nil || got == nil || !got.Unissued {
		t.Fatalf("a re-created key: %+v, %v; want Unissued", got, err)
	}
	live, err := NewLiveReader(s, nil).Lookup(ctx, "ns", "job")
	if err != nil || live.Grant != nil || live.Unissued != got.Token {
		t.Fatalf("the webhook's view of a re-created key: %+v, %v; want no grant", live, err)
	}
	// Garbage under a key fencer did not write is no read error either: it
	// is to be deleted, and must not wedge the Lease.
	if _, err := cli.Put(ctx, key, "\xff"); err != nil {
		t.Fatal(err)
	}
	if got, _, err = s.ReadGrant(ctx, "ns", "job"); err != nil || !got.Unissued {
		t.Fatalf("garbage under the key: %+v, %v", got, err)
	}
}

// A failed controller transaction whose answer lacks the Else branch's read
// of the leader key shows neither a held nor a lost term: it is a broken
// answer, not a panic and not ErrNotLeader.
func TestHeldInWithoutTheLeaderRead(t *testing.T) {
	term := Term{Key: "/fencer/controller/leader/x", Rev: 5}
	if err := term.heldIn(&clientv3.TxnResponse{Header: &etcdserverpb.ResponseHeader{Revision: 9}}); !errors.Is(err, etcdreply.ErrMalformed) || errors.Is(err, ErrNotLeader) {
		t.Fatalf("an answer with no responses: %v; want ErrMalformed", err)
	}
	answer := func(createRev int64) *clientv3.TxnResponse {
		return &clientv3.TxnResponse{Header: &etcdserverpb.ResponseHeader{Revision: 9}, Responses: []*etcdserverpb.ResponseOp{{Response: &etcdserverpb.ResponseOp_ResponseRange{
			ResponseRange: &etcdserverpb.RangeResponse{Kvs: []*mvccpb.KeyValue{{Key: []byte(term.Key), CreateRevision: createRev}}}}}}}
	}
	if err := term.heldIn(answer(5)); err != nil {
		t.Fatalf("the leader key at the term's revision: %v; want the term held", err)
	}
	if err := term.heldIn(answer(7)); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("the leader key of a later term: %v; want ErrNotLeader", err)
	}
}
