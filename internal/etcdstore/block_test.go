package etcdstore

import (
	"context"
	"errors"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/fencer-io/fencer/pkg/etcdkeys"
)

// TestConcurrentClaimersNeverOverlap: claimers racing on one range, one of
// them deposed mid-way, never produce overlapping blocks, and the deposed
// one claims nothing after it was superseded.
func TestConcurrentClaimersNeverOverlap(t *testing.T) {
	cli := startEtcd(t)
	ctx := context.Background()
	old, oldSession := win(t, cli, "old")
	oldStore := NewStore(cli, DefaultPrefix, old, nil)

	var mu sync.Mutex
	var blocks []Block
	claim := func(s *Store, n int) error {
		for range n {
			b, _, err := s.ClaimBlock(ctx, "ns", "ids", 1, 1<<40, 13, "p", "uid-p")
			if err != nil {
				return err
			}
			mu.Lock()
			blocks = append(blocks, b)
			mu.Unlock()
		}
		return nil
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() { defer wg.Done(); _ = claim(oldStore, 25) }()
	}
	wg.Wait()

	if _, err := cli.Revoke(ctx, oldSession.Lease()); err != nil {
		t.Fatal(err)
	}
	nu, _ := win(t, cli, "new")
	newStore := NewStore(cli, DefaultPrefix, nu, nil)
	errs := make(chan error, 8)
	for range 4 {
		wg.Add(2)
		go func() { defer wg.Done(); errs <- claim(newStore, 25) }()
		go func() { defer wg.Done(); errs <- claim(oldStore, 1) }()
	}
	wg.Wait()
	close(errs)
	deposed := 0
	for err := range errs {
		switch {
		case errors.Is(err, ErrNotLeader):
			deposed++
		case err != nil:
			t.Fatal(err)
		}
	}
	if deposed != 4 {
		t.Fatalf("%d of 4 deposed claims were refused", deposed)
	}
	sort.Slice(blocks, func(i, j int) bool { return blocks[i].First < blocks[j].First })
	if len(blocks) != 200 {
		t.Fatalf("%d blocks, want 200", len(blocks))
	}
	for i := 1; i < len(blocks); i++ {
		if blocks[i].First <= blocks[i-1].Last {
			t.Fatalf("overlap: %v and %v", blocks[i-1], blocks[i])
		}
	}
	next, err := newStore.ReadNext(ctx, "ns", "ids", 1)
	if err != nil || next != 1+200*13 {
		t.Fatalf("next %d (%v), want %d", next, err, 1+200*13)
	}
}

func TestClaimBlockEdges(t *testing.T) {
	cli := startEtcd(t)
	ctx := context.Background()
	e, _ := win(t, cli, "a")
	s := NewStore(cli, DefaultPrefix, e, nil)
	const max = 1<<63 - 2
	b, _, err := s.ClaimBlock(ctx, "ns", "top", max-4, max, 10, "p", "uid-p")
	if err != nil || b.First != max-4 || b.Last != max {
		t.Fatalf("final short block near MaxInt64: %+v %v", b, err)
	}
	if _, _, err := s.ClaimBlock(ctx, "ns", "top", max-4, max, 10, "p", "uid-p"); !errors.Is(err, ErrExhausted) {
		t.Fatalf("after the last block: %v, want ErrExhausted", err)
	}
	if _, _, err := s.ClaimBlock(ctx, "ns", "bad", 0, 1<<63-1, 10, "p", "uid-p"); err == nil {
		t.Fatal("max = MaxInt64 accepted")
	}
	if _, err := cli.Put(ctx, etcdkeys.IDRangeNextKey(DefaultPrefix, "ns", "junk"), "twelve"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.ClaimBlock(ctx, "ns", "junk", 0, 100, 10, "p", "uid-p"); err == nil || !strings.Contains(err.Error(), `holds "twelve", not a decimal ID`) {
		t.Fatalf("malformed next key: %v", err)
	}
}
