package idgen

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Claim is one attempt to take the next block of IDs under an IDRange's
// next-ID key, the transaction fencer's controller and the SDK's allocator
// share:
//
//	Txn(If ModRevision(next) == seen [&& Guard...]) Then Put(next, last+1) Else OrElse...
//
// so blocks never overlap and are never reissued: next only grows.
type Claim struct {
	Cli *clientv3.Client
	// Key is the next-ID key (etcdkeys.IDRangeNextKey).
	Key string
	// Min and Max are the range's spec.min and spec.max; Size the block size.
	Min, Max, Size int64
	// Guard are extra comparisons the claim must also pass (the
	// controller's election fence); OrElse runs when the transaction fails,
	// so the caller can tell a failed guard from a lost race.
	Guard  []clientv3.Cmp
	OrElse []clientv3.Op
	// Record, when set, gives writes that commit with the claim of b (the
	// controller's record of whom the block is for).
	Record func(b Block) ([]clientv3.Op, error)
	// Seen is the highest next the claimer has set itself, 0 for none: a
	// next read below it means etcd went back (restored from an older
	// snapshot), and every block above it may have been issued already.
	// The claim is refused with ErrNextWentBack.
	Seen int64
}

// ErrNextWentBack refuses a claim whose next-ID key reads below a value
// the claimer itself set: etcd went back in time (restored from an older
// snapshot, or replaced by an empty one), and the IDs between may have
// been issued. See docs/operations.md, restoring etcd.
var ErrNextWentBack = errors.New("idgen: the IDRange's next-ID key went back below a value this allocator set (etcd restored from an older snapshot?); IDs above it may have been issued already")

// Try makes one attempt. claimed is false when the transaction failed:
// another claimer moved next first, or a guard failed (resp says which).
// When fewer than Size IDs remain the shorter final block is claimed; after
// it, ErrExhausted with b.First the key's value.
func (c Claim) Try(ctx context.Context) (b Block, claimed bool, resp *clientv3.TxnResponse, err error) {
	if c.Max == math.MaxInt64 {
		// next = last+1 must stay representable; the API refuses this max.
		return Block{}, false, nil, fmt.Errorf("max %d leaves no room for the next-ID key; use at most %d", c.Max, int64(math.MaxInt64-1))
	}
	next, modRev, err := c.ReadNext(ctx)
	if err != nil {
		return Block{}, false, nil, err
	}
	if next < c.Seen {
		return Block{}, false, nil, fmt.Errorf("%w: %s reads %d, below %d", ErrNextWentBack, c.Key, next, c.Seen)
	}
	if next > c.Max {
		return Block{First: next}, false, nil, ErrExhausted
	}
	b = Block{First: next, Last: lastOf(next, c.Size, c.Max)}
	then := []clientv3.Op{clientv3.OpPut(c.Key, strconv.FormatInt(b.Last+1, 10))}
	if c.Record != nil {
		ops, err := c.Record(b)
		if err != nil {
			return Block{}, false, nil, err
		}
		then = append(then, ops...)
	}
	resp, err = c.Cli.Txn(ctx).
		If(append([]clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(c.Key), "=", modRev)}, c.Guard...)...).
		Then(then...).
		Else(c.OrElse...).
		Commit()
	if err != nil {
		return Block{}, false, nil, err
	}
	return b, resp.Succeeded, resp, nil
}

// ReadNext reads the next unallocated ID (Min if nothing was claimed yet);
// modRev is 0 when the key does not exist, which makes a claim's comparison
// "the key is still absent".
func (c Claim) ReadNext(ctx context.Context) (next, modRev int64, err error) {
	resp, err := c.Cli.Get(ctx, c.Key)
	if err != nil {
		return 0, 0, err
	}
	if len(resp.Kvs) == 0 {
		return c.Min, 0, nil
	}
	kv := resp.Kvs[0]
	next, err = strconv.ParseInt(string(kv.Value), 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("etcd key %s holds %q, not a decimal ID: %w", c.Key, kv.Value, err)
	}
	return max(next, c.Min), kv.ModRevision, nil
}

// lastOf is the last ID of a block of size starting at first, capped at max,
// without overflowing int64.
func lastOf(first, size, max int64) int64 {
	if size <= 0 || max-first < size-1 {
		return max
	}
	return first + size - 1
}
