package idgen

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"
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
	for _, bad := range []string{"", "block=", "block=1", "block=5-1", "block=+1-5", "block=1-5,", " block=1-5", "slot=1,token=2", "block=-1-5", "block=01-10", "block=1-010", "block=00-0"} {
		if _, err := ParseBlock(bad); err == nil {
			t.Errorf("ParseBlock(%q) accepted", bad)
		}
	}
}

// FuzzParseBlock: any string is a block with first <= last, or an error.
func FuzzParseBlock(f *testing.F) {
	for _, s := range []string{"block=1-100", "block=5-1", "block=1-", "block=99999999999999999999-1", "block=01-10"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b, err := ParseBlock(s)
		if err != nil {
			return
		}
		if b.First > b.Last || b.First < 0 {
			t.Fatalf("ParseBlock(%q) = %v", s, b)
		}
		if back := fmt.Sprintf("block=%d-%d", b.First, b.Last); back != s {
			t.Fatalf("ParseBlock(%q) = %v, which prints as %q", s, b, back)
		}
	})
}

// A block annotation that the controller did not hand to this pod is
// refused: forged to span every block ever claimed, copied from another
// pod, or with its last ID stretched. The genuine owner still consumes its
// own block.
func TestForgedAndCopiedBlocksAreRefused(t *testing.T) {
	cli := startEtcd(t)
	ctx := context.Background()
	mine, err := claimFor(ctx, cli, 1, 1_000_000, 100, "p", "uid-p")
	if err != nil {
		t.Fatal(err)
	}
	theirs, err := claimFor(ctx, cli, 1, 1_000_000, 100, "q", "uid-q")
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		annotation string
		uid        string
		want       string
	}{
		"forged across every block": {"block=2-999999", "uid-p", "fencer never claimed a block starting at 2"},
		"forged over a real block":  {fmt.Sprintf("block=%d-%d", mine.First, mine.Last+100_000), "uid-p", fmt.Sprintf("fencer handed block %d-%d to pod p (uid uid-p)", mine.First, mine.Last)},
		"copied from another pod":   {fmt.Sprintf("block=%d-%d", theirs.First, theirs.Last), "uid-p", "to pod q (uid uid-q), not"},
		"a real block, no UID":      {fmt.Sprintf("block=%d-%d", mine.First, mine.Last), "", "needs the pod's UID"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := ConsumeBlock(ctx, cli, "", "ns", "ids", tc.annotation, types.UID(tc.uid))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("ConsumeBlock(%s) = %v, want an error containing %q", tc.annotation, err, tc.want)
			}
			if tc.uid != "" && !errors.Is(err, ErrBlockNotClaimed) {
				t.Fatalf("want ErrBlockNotClaimed, got %v", err)
			}
		})
	}
	for _, own := range []struct {
		b   Block
		uid types.UID
	}{{mine, "uid-p"}, {theirs, "uid-q"}} {
		if got, err := ConsumeBlock(ctx, cli, "", "ns", "ids", fmt.Sprintf("block=%d-%d", own.b.First, own.b.Last), own.uid); err != nil || got != own.b {
			t.Fatalf("the owner of %v: %v %v", own.b, got, err)
		}
	}
}
