package idgen

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"math/bits"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/fencer-io/fencer/pkg/etcdkeys"
	"github.com/fencer-io/fencer/test/support/testenv"
)

func startEtcd(t testing.TB) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{testenv.Etcd(t)}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// bitmap records IDs in [base, base+n) and reports duplicates.
type bitmap struct {
	base  int64
	words []uint64
}

func newBitmap(base, n int64) *bitmap { return &bitmap{base: base, words: make([]uint64, n/64+1)} }

// set marks id and reports whether it was already marked.
func (b *bitmap) set(id int64) bool {
	i := id - b.base
	mask := uint64(1) << (i % 64)
	return atomic.OrUint64(&b.words[i/64], mask)&mask != 0
}

func (b *bitmap) count() int {
	n := 0
	for _, w := range b.words {
		n += bits.OnesCount64(w)
	}
	return n
}

// TestManyAllocatorsNeverDuplicate: 8 allocators × 4 goroutines × 1M IDs
// each, claiming from etcd while a "controller" claims blocks of the same
// range with its own transaction: no ID twice, none inside a controller
// block, and no gaps but the remainders each allocator left unused.
func TestManyAllocatorsNeverDuplicate(t *testing.T) {
	cli := startEtcd(t)
	ctx := context.Background()
	const allocators, goroutines, perG, size = 8, 4, 1_000_000, 50_000
	const min = int64(1_000)
	span := int64(allocators*goroutines*perG + 4*allocators*size + 100*size)
	seen := newBitmap(min, span)
	var dups, outside atomic.Int64
	var wg sync.WaitGroup
	stopController := make(chan struct{})
	var controllerBlocks []Block
	go func() { // the controller's Blocks mode claims from the same key
		for {
			select {
			case <-stopController:
				return
			case <-time.After(20 * time.Millisecond):
			}
			b, err := controllerClaim(ctx, cli, min, min+span-1, 97)
			if err == nil {
				controllerBlocks = append(controllerBlocks, b)
			}
		}
	}()
	for range allocators {
		a, err := NewBlocks(cli, BlockOptions{Namespace: "ns", Name: "ids", Min: min, Max: min + span - 1, BlockSize: size})
		if err != nil {
			t.Fatal(err)
		}
		for range goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range perG {
					id, err := a.Next(ctx)
					if err != nil {
						t.Error(err)
						return
					}
					if id < min || id >= min+span {
						outside.Add(1)
						continue
					}
					if seen.set(id) {
						dups.Add(1)
					}
				}
			}()
		}
	}
	wg.Wait()
	close(stopController)
	time.Sleep(50 * time.Millisecond)
	if dups.Load() != 0 || outside.Load() != 0 {
		t.Fatalf("%d duplicate IDs, %d outside the range", dups.Load(), outside.Load())
	}
	if got := seen.count(); got != allocators*goroutines*perG {
		t.Fatalf("%d distinct IDs, want %d", got, allocators*goroutines*perG)
	}
	for _, b := range controllerBlocks {
		for id := b.First; id <= b.Last; id++ {
			if seen.set(id) {
				t.Fatalf("ID %d was issued by an allocator inside the controller's block %v", id, b)
			}
		}
	}
	resp, err := cli.Get(ctx, etcdkeys.IDRangeNextKey(etcdkeys.DefaultPrefix, "ns", "ids"))
	if err != nil {
		t.Fatal(err)
	}
	next, _ := strconv.ParseInt(string(resp.Kvs[0].Value), 10, 64)
	// Every ID below next is either issued or a remainder: each allocator
	// leaves at most its current and its prefetched block partly unused.
	unused := int(next-min) - seen.count()
	if unused > allocators*2*size {
		t.Fatalf("%d IDs below next were never issued; remainders account for at most %d", unused, allocators*2*size)
	}
	t.Logf("%d IDs, %d controller blocks, %d unused remainder IDs", allocators*goroutines*perG, len(controllerBlocks), unused)
}

// controllerClaim is the controller's block claim (etcdstore.Store.ClaimBlock
// without its election fence, which needs a controller term).
func controllerClaim(ctx context.Context, cli *clientv3.Client, min, max, size int64) (Block, error) {
	return claimFor(ctx, cli, min, max, size, "p", "pod-uid")
}

// claimFor claims a block of IDRange ns/ids for a pod as fencer's
// controller does, with the claim record naming the pod.
func claimFor(ctx context.Context, cli *clientv3.Client, min, max, size int64, pod, uid string) (Block, error) {
	c := Claim{Cli: cli, Key: etcdkeys.IDRangeNextKey(etcdkeys.DefaultPrefix, "ns", "ids"), Min: min, Max: max, Size: size,
		Record: func(b Block) ([]clientv3.Op, error) {
			v, err := json.Marshal(BlockClaim{Pod: pod, PodUID: uid, Last: b.Last})
			return []clientv3.Op{clientv3.OpPut(etcdkeys.IDRangeClaimKey(etcdkeys.DefaultPrefix, "ns", "ids", b.First), string(v))}, err
		}}
	for {
		b, claimed, _, err := c.Try(ctx)
		if err != nil || claimed {
			return b, err
		}
	}
}

func TestExhaustionAndShortFinalBlock(t *testing.T) {
	cli := startEtcd(t)
	ctx := context.Background()
	a, err := NewBlocks(cli, BlockOptions{Namespace: "ns", Name: "small", Min: 1, Max: 25, BlockSize: 10})
	if err != nil {
		t.Fatal(err)
	}
	for want := int64(1); want <= 25; want++ {
		id, err := a.Next(ctx)
		if err != nil || id != want {
			t.Fatalf("Next = %d, %v; want %d", id, err, want)
		}
	}
	if _, err := a.Next(ctx); !errors.Is(err, ErrExhausted) {
		t.Fatalf("after 25 IDs: %v, want ErrExhausted", err)
	}
}

// etcd restored from a snapshot taken before this allocator's last claims
// (or replaced by an empty one) puts the next-ID key back, or removes it:
// the allocator's next claim would take a block it issued already. It
// refuses with ErrNextWentBack instead, and no ID is issued twice.
func TestAnAllocatorRefusesANextThatWentBack(t *testing.T) {
	cli := startEtcd(t)
	ctx := context.Background()
	a, err := NewBlocks(cli, BlockOptions{Namespace: "ns", Name: "restored", Min: 0, Max: 1000, BlockSize: 10})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	key := etcdkeys.IDRangeNextKey(etcdkeys.DefaultPrefix, "ns", "restored")
	for _, tc := range []struct {
		name    string
		restore func() error
		repair  int64
	}{
		{"put back", func() error { _, err := cli.Put(ctx, key, "0"); return err }, 300},
		{"gone empty", func() error { _, err := cli.Delete(ctx, key); return err }, 600},
	} {
		name, restore := tc.name, tc.restore
		seen := map[int64]bool{}
		for i := 0; ; i++ {
			if i == 12 {
				if err := restore(); err != nil {
					t.Fatal(err)
				}
			}
			id, err := a.Next(ctx)
			if errors.Is(err, ErrNextWentBack) {
				break
			}
			if err != nil {
				t.Fatalf("%s: Next: %v", name, err)
			}
			if seen[id] {
				t.Fatalf("%s: ID %d issued twice", name, id)
			}
			seen[id] = true
			if i > 100 {
				t.Fatalf("%s: 100 IDs after the next-ID key went back, and no refusal", name)
			}
		}
		if _, err := a.Next(ctx); !errors.Is(err, ErrNextWentBack) {
			t.Fatalf("%s: the Next after the refusal: %v, want ErrNextWentBack again", name, err)
		}
		// The repair (docs/operations.md) sets the key past every issued
		// ID: claims go on from there.
		if _, err := cli.Put(ctx, key, strconv.FormatInt(tc.repair, 10)); err != nil {
			t.Fatal(err)
		}
		if id, err := a.Next(ctx); err != nil || id < tc.repair {
			t.Fatalf("%s: Next after the repair: %d, %v; want an ID from %d", name, id, err, tc.repair)
		}
	}
}

// A range that ends just below MaxInt64 stays exhausted however often Next
// is called after: the counter past the end wraps at the top of int64, and
// a wrapped counter must not hand out negative IDs.
func TestExhaustionAtTheTopOfInt64(t *testing.T) {
	cli := startEtcd(t)
	ctx := context.Background()
	a, err := NewBlocks(cli, BlockOptions{Namespace: "ns", Name: "top", Min: math.MaxInt64 - 3, Max: math.MaxInt64 - 1, BlockSize: 10})
	if err != nil {
		t.Fatal(err)
	}
	for want := int64(math.MaxInt64 - 3); want <= math.MaxInt64-1; want++ {
		if id, err := a.Next(ctx); err != nil || id != want {
			t.Fatalf("Next = %d, %v; want %d", id, err, want)
		}
	}
	for i := range 4 {
		if id, err := a.Next(ctx); !errors.Is(err, ErrExhausted) {
			t.Fatalf("call %d past the end: Next = %d, %v; want ErrExhausted", i+1, id, err)
		}
	}
}

func TestAdaptiveGrows(t *testing.T) {
	cli := startEtcd(t)
	a, err := NewBlocks(cli, BlockOptions{Namespace: "ns", Name: "adaptive", Min: 0, Max: 1 << 40, BlockSize: 100,
		Adaptive: true, MaxBlockSize: 800, TargetDuration: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	for range 5000 {
		if _, err := a.Next(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if got := a.size.Load(); got != 800 {
		t.Fatalf("block size %d after fast consumption, want it grown to the 800 cap", got)
	}
}

func TestBlockOptionsRefused(t *testing.T) {
	for _, o := range []BlockOptions{
		{Namespace: "ns", Name: "x", Min: 0, Max: 10},
		{Namespace: "ns", Name: "x", Min: 5, Max: 4, BlockSize: 1},
		{Namespace: "ns", Name: "x", Min: 0, Max: 1<<63 - 1, BlockSize: 1},
		{Namespace: "ns", Name: "x", Min: -10, Max: 10, BlockSize: 1},
		{Min: 0, Max: 10, BlockSize: 1},
	} {
		// A client that is never dialled: only the options are wrong.
		if _, err := NewBlocks(new(clientv3.Client), o); err == nil {
			t.Errorf("NewBlocks(%+v) accepted", o)
		}
	}
	good := BlockOptions{Namespace: "ns", Name: "x", Min: 0, Max: 10, BlockSize: 1}
	if _, err := NewBlocks(new(clientv3.Client), good); err != nil {
		t.Fatalf("NewBlocks(%+v): %v", good, err)
	}
	// Without a client the first Next's background fetch would panic, where
	// no caller can recover it.
	if _, err := NewBlocks(nil, good); err == nil || !strings.Contains(err.Error(), "needs an etcd client") {
		t.Errorf("NewBlocks without a client: %v", err)
	}
	if _, err := NewSnowflake(context.Background(), nil, SnowflakeOptions{Namespace: "ns", Name: "workers", Slot: 1, Token: 5, PodUID: "u"}); err == nil || !strings.Contains(err.Error(), "needs an etcd client") {
		t.Errorf("NewSnowflake without a client: %v", err)
	}
}
