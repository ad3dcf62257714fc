package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-io/fencer/pkg/etcdkeys"
)

// ErrExhausted means an IDRange has nothing left to hand out.
var ErrExhausted = errors.New("the ID range is exhausted")

// Block is a claimed range of IDs, both ends inclusive.
type Block struct{ First, Last int64 }

// Size is how many IDs the block holds.
func (b Block) Size() int64 { return b.Last - b.First + 1 }

// ClaimBlock hands out the next block of up to size IDs in [min,max] with
// Txn(If ModRevision(next)==seen) Then Put(next, last+1), fenced by this
// controller's term. Blocks never overlap and are never reissued: next only
// grows. When fewer than size IDs remain, the shorter final block is handed
// out; after it, ErrExhausted.
func (s *Store) ClaimBlock(ctx context.Context, namespace, name string, min, max, size int64) (b Block, next int64, err error) {
	defer s.timed("claim")(&err)
	ctx, cancel := s.bound(ctx)
	defer cancel()
	if max == math.MaxInt64 {
		// next = last+1 must stay representable; the API refuses this max.
		return Block{}, 0, fmt.Errorf("max %d leaves no room for the next-ID key; use at most %d", max, int64(math.MaxInt64-1))
	}
	key := etcdkeys.IDRangeNextKey(s.prefix, namespace, name)
	for {
		term, err := s.elector.Term()
		if err != nil {
			return Block{}, 0, err
		}
		cur, modRev, err := s.readNext(ctx, key, min)
		if err != nil {
			return Block{}, 0, err
		}
		if cur > max {
			return Block{}, cur, ErrExhausted
		}
		b = Block{First: cur, Last: lastOf(cur, size, max)}
		resp, err := s.cli.Txn(ctx).
			If(term.cmp(), clientv3.Compare(clientv3.ModRevision(key), "=", modRev)).
			Then(clientv3.OpPut(key, strconv.FormatInt(b.Last+1, 10))).
			Else(clientv3.OpGet(term.Key)).
			Commit()
		if err != nil {
			return Block{}, 0, err
		}
		if resp.Succeeded {
			return b, b.Last + 1, nil
		}
		if !term.heldIn(resp) {
			return Block{}, 0, ErrNotLeader
		}
		// Another claimer moved next first: read it again.
	}
}

// lastOf is the last ID of a block of size starting at first, capped at max,
// without overflowing int64.
func lastOf(first, size, max int64) int64 {
	if size <= 0 || max-first < size-1 {
		return max
	}
	return first + size - 1
}

// ReadNext returns the next unallocated ID (min if nothing was claimed yet).
func (s *Store) ReadNext(ctx context.Context, namespace, name string, min int64) (int64, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	next, _, err := s.readNext(ctx, etcdkeys.IDRangeNextKey(s.prefix, namespace, name), min)
	return next, err
}

// readNext reads the next key; modRev is 0 when it does not exist yet, which
// makes the claim's comparison "the key is still absent".
func (s *Store) readNext(ctx context.Context, key string, min int64) (next, modRev int64, err error) {
	resp, err := s.cli.Get(ctx, key)
	if err != nil {
		return 0, 0, err
	}
	if len(resp.Kvs) == 0 {
		return min, 0, nil
	}
	kv := resp.Kvs[0]
	next, err = strconv.ParseInt(string(kv.Value), 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("etcd key %s holds %q, not a decimal ID: %w", key, kv.Value, err)
	}
	return max(next, min), kv.ModRevision, nil
}
