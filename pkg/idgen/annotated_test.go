package idgen

import (
	"context"
	"errors"
	"fmt"
	"testing"
)

// TestRestartedContainerNeverReissuesAnnotatedIDs: a container consumes its
// pod's annotated block and issues IDs from it, then restarts (the
// annotation is still there). The restarted container is refused the block
// and falls back to the allocator; no ID is issued twice.
func TestRestartedContainerNeverReissuesAnnotatedIDs(t *testing.T) {
	cli := startEtcd(t)
	ctx := context.Background()
	const ns, name, size = "ns", "ids", 100
	// The controller claims the pod's block and writes the annotation.
	b, err := controllerClaim(ctx, cli, 1, 1_000_000, size)
	if err != nil {
		t.Fatal(err)
	}
	annotation := fmt.Sprintf("block=%d-%d", b.First, b.Last)

	issued := map[int64]int{}
	// First start: the block is fresh.
	got, err := ConsumeBlock(ctx, cli, "", ns, name, annotation, "pod-uid")
	if err != nil || got != (Block{b.First, b.Last}) {
		t.Fatalf("first start: %v %v, want block %v", got, err, b)
	}
	for id := got.First; id <= got.Last-50; id++ { // crash half way
		issued[id]++
	}
	// Restart: the same annotation must not be used again.
	if _, err := ConsumeBlock(ctx, cli, "", ns, name, annotation, "pod-uid"); !errors.Is(err, ErrBlockConsumed) {
		t.Fatalf("restarted container: %v, want ErrBlockConsumed", err)
	}
	alloc, err := NewBlocks(cli, BlockOptions{Namespace: ns, Name: name, Min: 1, Max: 1_000_000, BlockSize: size})
	if err != nil {
		t.Fatal(err)
	}
	defer alloc.Close()
	for range 3 * size {
		id, err := alloc.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		issued[id]++
	}
	for id, n := range issued {
		if n > 1 {
			t.Fatalf("ID %d issued %d times", id, n)
		}
	}
}

func TestParseBlock(t *testing.T) {
	if b, err := ParseBlock("block=1-100"); err != nil || b != (Block{1, 100}) {
		t.Fatalf("%v %v", b, err)
	}
	for _, bad := range []string{"", "block=", "block=1", "block=5-1", "block=+1-5", "block=1-5,", " block=1-5", "slot=1,token=2", "block=-1-5"} {
		if _, err := ParseBlock(bad); err == nil {
			t.Errorf("ParseBlock(%q) accepted", bad)
		}
	}
}

// FuzzParseBlock: any string is a block with first <= last, or an error.
func FuzzParseBlock(f *testing.F) {
	for _, s := range []string{"block=1-100", "block=5-1", "block=1-", "block=99999999999999999999-1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b, err := ParseBlock(s)
		if err == nil && (b.First > b.Last || b.First < 0) {
			t.Fatalf("ParseBlock(%q) = %v", s, b)
		}
	})
}
