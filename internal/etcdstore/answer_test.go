package etcdstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/fencer-io/fencer/internal/etcdreply"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
	"github.com/fencer-io/fencer/test/support/testenv"
)

// A grant whose answer comes back without a header, or with one that has
// no revision (what a faulty proxy could send), has no token to read: it
// fails like a write whose outcome is unknown, never with token 0, and the
// key it may have written goes with its revoked etcd lease (well before
// the grant's TTL), so no grant is left that no status names.
func TestAGrantAnsweredWithoutAHeaderLeavesNoGrant(t *testing.T) {
	cli, b := testenv.BrokenClient(t, testenv.Etcd(t))
	ctx := context.Background()
	e, _ := win(t, cli, "a")
	s := NewStore(cli, DefaultPrefix, e, nil)
	for name, breaks := range map[string]func(any){"no header": testenv.NoHeader, "a header without a revision": testenv.EmptyHeader} {
		b.Next(testenv.KVTxn, breaks)
		if g, err := s.GrantLease(ctx, "ns", "l", "lease-uid", "pod-a", "uid-a", 60*time.Second, time.Now()); !errors.Is(err, etcdreply.ErrMalformed) {
			t.Fatalf("%s: GrantLease: %+v, %v; want an error naming the broken answer", name, g, err)
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
				t.Fatalf("%s: the grant's key outlived its revoked etcd lease", name)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	g, err := s.GrantLease(ctx, "ns", "l", "lease-uid", "pod-b", "uid-b", 10*time.Second, time.Now())
	if err != nil || g.Holder != "pod-b" {
		t.Fatalf("the next grant: %+v, %v", g, err)
	}
}

// etcd's election library reads a campaign's answers unchecked: a broken
// one costs the Elector one campaign, not the process.
func TestACampaignAnsweredBrokenIsRetried(t *testing.T) {
	cli, b := testenv.BrokenClient(t, testenv.Etcd(t))
	e := NewElector(cli, DefaultPrefix, "a", time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b.Next(testenv.KVTxn, testenv.NoHeader)
	done := make(chan error, 1)
	go func() { done <- e.Start(ctx) }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := e.Term(); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the Elector never won after a broken campaign answer")
		}
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("the Elector ended with %v", err)
	}
}

// A write refused by its comparison is told apart from a deposed term by
// the Else branch's read of the leader key. An answer without that read
// shows neither, so it is a broken answer (the reconcile reports it and
// retries, as when etcd is away), not ErrNotLeader, which the controller
// takes, silently, for a lost term.
func TestARefusedWriteAnsweredWithoutItsElseReadIsBroken(t *testing.T) {
	cli, b := testenv.BrokenClient(t, testenv.Etcd(t))
	ctx := context.Background()
	e, _ := win(t, cli, "a")
	s := NewStore(cli, DefaultPrefix, e, nil)
	if _, err := s.GrantLease(ctx, "ns", "l", "lease-uid", "pod-a", "uid-a", 60*time.Second, time.Now()); err != nil {
		t.Fatal(err)
	}
	for name, breaks := range map[string]func(any){"no responses": testenv.NoResponses, "a put for the read": testenv.PutsForReads} {
		b.Next(testenv.KVTxn, breaks)
		_, err := s.GrantLease(ctx, "ns", "l", "lease-uid", "pod-b", "uid-b", 60*time.Second, time.Now())
		if !errors.Is(err, etcdreply.ErrMalformed) || errors.Is(err, ErrNotLeader) {
			t.Fatalf("%s: a refused grant: %v; want an error naming the broken answer", name, err)
		}
	}
	if _, err := s.GrantLease(ctx, "ns", "l", "lease-uid", "pod-b", "uid-b", 60*time.Second, time.Now()); !errors.Is(err, ErrHeld) {
		t.Fatalf("the same grant answered whole: %v, want ErrHeld", err)
	}

	// A block claim whose comparison failed, answered without the read.
	b.Next(testenv.KVTxn, func(reply any) {
		r := reply.(*etcdserverpb.TxnResponse)
		r.Succeeded, r.Responses = false, nil
	})
	if _, _, err := s.ClaimBlock(ctx, "ns", "ids", 1, 1000, 10, "pod-a", "uid-a"); !errors.Is(err, etcdreply.ErrMalformed) || errors.Is(err, ErrNotLeader) {
		t.Fatalf("a refused claim answered without its read: %v; want an error naming the broken answer", err)
	}
	if _, _, err := s.ClaimBlock(ctx, "ns", "ids", 1, 1000, 10, "pod-a", "uid-a"); err != nil {
		t.Fatalf("the next claim: %v", err)
	}
}
