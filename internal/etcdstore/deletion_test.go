package etcdstore

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-io/fencer/pkg/etcdkeys"
)

// A Lease's DELETE, as the webhook admits it: the grant is released (key
// deleted, etcd lease revoked) and the deletion recorded in one
// transaction, and from then on that Lease object (its UID) is granted to
// no one, while a Lease created again under the same name (another UID)
// is. Only the leader may lift the record, and only the record it read.
func TestReleaseDeletedEndsTheGrantAndBarsItsLease(t *testing.T) {
	cli := startEtcd(t)
	ctx := context.Background()
	e, _ := win(t, cli, "a")
	s := NewStore(cli, DefaultPrefix, e, nil)
	at := time.Date(2026, 12, 4, 5, 0, 0, 0, time.UTC)

	g, err := s.GrantLease(ctx, "ns", "l", "uid-1", "pod-a", "pod-uid-a", 30*time.Second, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if got, err := s.GetGrant(ctx, "ns", "l"); err != nil || got.LeaseUID != "uid-1" {
		t.Fatalf("the grant records Lease UID %q (%v), want uid-1", got.LeaseUID, err)
	}
	released, err := s.ReleaseDeleted(ctx, "ns", "l", "uid-1", at)
	if err != nil {
		t.Fatal(err)
	}
	if released == nil || released.Token != g.Token {
		t.Fatalf("ReleaseDeleted released %+v, want the grant with token %d", released, g.Token)
	}
	if got, err := s.GetGrant(ctx, "ns", "l"); err != nil || got != nil {
		t.Fatalf("after the DELETE was admitted etcd still holds %+v (%v)", got, err)
	}
	waitRevoked(t, s, g)

	if _, err := s.GrantLease(ctx, "ns", "l", "uid-1", "pod-b", "pod-uid-b", 30*time.Second, time.Now()); !errors.Is(err, ErrLeaseDeleted) {
		t.Fatalf("granting the deleted Lease object again: %v, want ErrLeaseDeleted", err)
	}
	d, err := s.DeletionOf(ctx, "ns", "l", "uid-1")
	if err != nil || d == nil || !d.At.Equal(at) || d.UID != "uid-1" || d.Name != "l" || d.Age < 0 || d.Age > 5*time.Second {
		t.Fatalf("DeletionOf = %+v, %v; want the deletion at %s, recorded just now (etcd's clock)", d, err, at)
	}
	// The record lives on its own etcd lease, so it expires by itself.
	resp, err := cli.Get(ctx, etcdkeys.DeletedLeaseKey(DefaultPrefix, "ns", "l", "uid-1"))
	if err != nil || len(resp.Kvs) != 1 || resp.Kvs[0].Lease == 0 {
		t.Fatalf("the deletion record: %+v, %v; want a key attached to an etcd lease", resp, err)
	}
	if ttl, err := cli.TimeToLive(ctx, clientv3.LeaseID(resp.Kvs[0].Lease)); err != nil || ttl.GrantedTTL != int64(DeletionRecordTTL/time.Second) {
		t.Fatalf("the deletion record's etcd lease: %+v, %v; want a TTL of %s", ttl, err, DeletionRecordTTL)
	}

	// The Lease created again under the name is another object.
	g2, err := s.GrantLease(ctx, "ns", "l", "uid-2", "pod-b", "pod-uid-b", 30*time.Second, time.Now())
	if err != nil {
		t.Fatalf("granting a new Lease object of the same name: %v", err)
	}
	if g2.Token <= g.Token {
		t.Fatalf("token %d not above %d", g2.Token, g.Token)
	}
	// A DELETE of the first Lease object, admitted again, does not end the
	// second one's grant, and dates the first one's record anew: the check
	// that a DELETE never happened counts from its last admission, and a
	// lift read before it fails.
	again := at.Add(time.Minute)
	if released, err := s.ReleaseDeleted(ctx, "ns", "l", "uid-1", again); err != nil || released != nil {
		t.Fatalf("ReleaseDeleted of the first Lease object while the second holds: released %+v, %v", released, err)
	}
	if got, err := s.GetGrant(ctx, "ns", "l"); err != nil || got == nil || got.Token != g2.Token {
		t.Fatalf("the second Lease's grant after a DELETE of the first: %+v, %v", got, err)
	}
	if err := s.ForgetDeletion(ctx, d); !errors.Is(err, ErrDeletionChanged) {
		t.Fatalf("lifting a record read before the DELETE came again: %v, want ErrDeletionChanged", err)
	}
	if d, err = s.DeletionOf(ctx, "ns", "l", "uid-1"); err != nil || d == nil || !d.At.Equal(again) {
		t.Fatalf("the first deletion's record after its DELETE came again: %+v, %v; want it dated %s", d, err, again)
	}
	// Its own deletion releases it.
	if released, err := s.ReleaseDeleted(ctx, "ns", "l", "uid-2", at); err != nil || released == nil || released.Token != g2.Token {
		t.Fatalf("ReleaseDeleted of the second Lease: %+v, %v", released, err)
	}
	// With nothing live, it only records the deletion.
	if released, err := s.ReleaseDeleted(ctx, "ns", "l", "uid-2", at); err != nil || released != nil {
		t.Fatalf("ReleaseDeleted with no grant: %+v, %v", released, err)
	}
	if _, err := s.ReleaseDeleted(ctx, "ns", "l", "", at); err == nil {
		t.Fatal("ReleaseDeleted with no UID: no error")
	}

	// Lifting the record: not on a stale read, not by a deposed leader.
	stale := *d
	stale.Revision--
	if err := s.ForgetDeletion(ctx, &stale); !errors.Is(err, ErrDeletionChanged) {
		t.Fatalf("ForgetDeletion of a record read earlier: %v, want ErrDeletionChanged", err)
	}
	if _, err := s.GrantLease(ctx, "ns", "l", "uid-1", "pod-b", "pod-uid-b", 30*time.Second, time.Now()); !errors.Is(err, ErrLeaseDeleted) {
		t.Fatalf("after a ForgetDeletion of a record read earlier: %v, want ErrLeaseDeleted", err)
	}
	if err := s.ForgetDeletion(ctx, d); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GrantLease(ctx, "ns", "l", "uid-1", "pod-b", "pod-uid-b", 30*time.Second, time.Now()); err != nil {
		t.Fatalf("granting once the record is lifted: %v", err)
	}
}

// A deposed controller cannot lift a deletion record.
func TestForgetDeletionIsFencedByTheTerm(t *testing.T) {
	cli := startEtcd(t)
	ctx := context.Background()
	old, session := win(t, cli, "old")
	s := NewStore(cli, DefaultPrefix, old, nil)
	if _, err := s.ReleaseDeleted(ctx, "ns", "l", "uid-1", time.Now()); err != nil {
		t.Fatal(err)
	}
	d, err := s.DeletionOf(ctx, "ns", "l", "uid-1")
	if err != nil || d == nil {
		t.Fatalf("DeletionOf: %+v, %v", d, err)
	}
	if _, err := cli.Revoke(ctx, session.Lease()); err != nil {
		t.Fatal(err)
	}
	win(t, cli, "new")
	if err := s.ForgetDeletion(ctx, d); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("a deposed controller lifting a deletion record: %v, want ErrNotLeader", err)
	}
	if d, err := s.DeletionOf(ctx, "ns", "l", "uid-1"); err != nil || d == nil {
		t.Fatalf("the record after a deposed controller's attempt: %+v, %v", d, err)
	}
}

func waitRevoked(t *testing.T, s *Store, g *Grant) {
	t.Helper()
	for try := 0; ; try++ {
		alive, err := s.LeaseAlive(context.Background(), g.LeaseID)
		if err != nil {
			t.Fatal(err)
		}
		if !alive {
			return
		}
		if try == 100 {
			t.Fatalf("the released grant's etcd lease %x was not revoked", g.LeaseID)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
