package etcdstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencer-io/fencer/internal/etcdreply"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
	"github.com/fencer-io/fencer/test/support/testenv"
)

// A grant whose answer comes back without a header (what a faulty proxy
// could send) has no token to read: it fails like a write whose outcome is
// unknown, and the key it may have written goes with its revoked etcd
// lease, so no grant is left that no status names.
func TestAGrantAnsweredWithoutAHeaderLeavesNoGrant(t *testing.T) {
	cli, b := testenv.BrokenClient(t, testenv.Etcd(t))
	ctx := context.Background()
	e, _ := win(t, cli, "a")
	s := NewStore(cli, DefaultPrefix, e, nil)
	b.Next(testenv.KVTxn, testenv.NoHeader)
	if g, err := s.GrantLease(ctx, "ns", "l", "lease-uid", "pod-a", "uid-a", 10*time.Second, time.Now()); !errors.Is(err, etcdreply.ErrMalformed) {
		t.Fatalf("GrantLease answered without a header: %+v, %v; want an error naming it", g, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := cli.Get(ctx, etcdkeys.LeaseKey(DefaultPrefix, "ns", "l"))
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the grant's key outlived its revoked etcd lease")
		}
		time.Sleep(50 * time.Millisecond)
	}
	g, err := s.GrantLease(ctx, "ns", "l", "lease-uid", "pod-b", "uid-b", 10*time.Second, time.Now())
	if err != nil || g.Holder != "pod-b" {
		t.Fatalf("the next grant: %+v, %v", g, err)
	}
}
