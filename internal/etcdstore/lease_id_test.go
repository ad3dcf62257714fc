package etcdstore

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-io/fencer/pkg/etcdkeys"
)

// A grant's, a slot's and a deletion record's etcd leases cannot be found
// by counting up from a lease of one's own, as etcd's own IDs can: before
// the grant's key is on its lease, any namespace's identity could revoke
// a lease it found, or attach a key of its own that keeps the holder from
// ever renewing it.
func TestTheControllersEtcdLeasesCannotBeCountedTo(t *testing.T) {
	cli := startEtcd(t)
	ctx := context.Background()
	e, _ := win(t, cli, "a")
	s := NewStore(cli, DefaultPrefix, e, nil)
	own, err := cli.Grant(ctx, 60) // an attacker's, just before
	if err != nil {
		t.Fatal(err)
	}
	g, err := s.GrantLease(ctx, "ns", "l", "lease-uid", "pod-a", "uid-a", 10*time.Second, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	slot, err := s.LeaseSlot(ctx, "ns", "ids", 0, 3, nil, "pod-a", "uid-a", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.ReleaseDeleted(ctx, "ns", "l", "lease-uid", time.Now()); err != nil {
		t.Fatal(err)
	}
	record, err := cli.Get(ctx, etcdkeys.DeletedLeaseKey(DefaultPrefix, "ns", "l", "lease-uid"))
	if err != nil || len(record.Kvs) != 1 {
		t.Fatalf("the deletion record: %v (%v)", record, err)
	}
	for what, id := range map[string]clientv3.LeaseID{"grant": g.LeaseID, "slot": slot.LeaseID, "deletion record": clientv3.LeaseID(record.Kvs[0].Lease)} {
		if d := int64(id) - int64(own.ID); d > 0 && d < 1<<20 {
			t.Errorf("the %s's etcd lease %x is %d above another's %x: found by counting up", what, id, d, own.ID)
		}
	}
}
