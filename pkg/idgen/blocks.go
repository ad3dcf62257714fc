// Package idgen generates unique IDs on top of fencer's IDRanges: a block
// allocator that claims segments straight from etcd (the same key and
// transaction as the controller's Blocks mode, so pods and the controller
// share one sequence), and a snowflake generator on a leased worker-ID slot.
package idgen

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-io/fencer/pkg/etcdkeys"
)

// ErrExhausted means the IDRange has no IDs left.
var ErrExhausted = errors.New("idgen: the ID range is exhausted")

// BlockOptions configure a block allocator.
type BlockOptions struct {
	// Prefix is fencer's etcd prefix ("/fencer" by default).
	Prefix string
	// Namespace and Name name the Blocks-mode IDRange.
	Namespace, Name string
	// Min and Max are the range's spec.min and spec.max. NewBlocks cannot
	// check them (etcd holds only next): a larger Max hands out IDs past the
	// range, never twice.
	Min, Max int64
	// BlockSize is the size of the blocks this allocator claims.
	BlockSize int64
	// Adaptive grows the block size (up to MaxBlockSize) when a block lasts
	// less than TargetDuration/2, and shrinks it (down to BlockSize) when one
	// lasts more than 2×TargetDuration, as Meituan Leaf does.
	Adaptive       bool
	MaxBlockSize   int64
	TargetDuration time.Duration
}

// segment is one claimed block being handed out.
type segment struct {
	next       atomic.Int64 // the next ID to hand out
	first      int64        // the block's first ID: below it, next wrapped past MaxInt64
	last       int64
	prefetchAt int64 // the ID whose issue triggers fetching the next block
	claimedAt  time.Time
}

// Blocks hands out IDs from blocks claimed in etcd. Next is safe for
// concurrent use; its fast path is one atomic add. The next block is fetched
// in the background once 10% of the current one is used (double
// buffering), so a block boundary costs no etcd round trip.
type Blocks struct {
	cli  *clientv3.Client
	key  string
	opts BlockOptions
	size atomic.Int64

	ctx   context.Context // ends at Close, stopping any fetch
	close context.CancelFunc

	// claimedTo is the highest next this allocator set (its last block's
	// last ID + 1): a next read below it is etcd gone back.
	claimedTo atomic.Int64

	cur  atomic.Pointer[segment]
	mu   sync.Mutex // guards swapping segments and the prefetch below
	pre  *segment   // a prefetched block, or nil
	wait chan struct{}
	err  error // the last prefetch error, reported by the next slow path
}

// NewBlocks returns an allocator; it claims its first block on first use.
func NewBlocks(cli *clientv3.Client, o BlockOptions) (*Blocks, error) {
	switch {
	case o.BlockSize <= 0:
		return nil, fmt.Errorf("idgen: BlockSize must be positive, got %d", o.BlockSize)
	case o.Min < 0 || o.Min > o.Max || o.Max == math.MaxInt64:
		return nil, fmt.Errorf("idgen: need 0 <= Min <= Max < MaxInt64, as an IDRange's spec does, got [%d, %d]", o.Min, o.Max)
	case o.Namespace == "" || o.Name == "":
		return nil, errors.New("idgen: Namespace and Name of the IDRange are required")
	case cli == nil:
		return nil, errors.New("idgen: NewBlocks needs an etcd client (fence.LoadEtcdAccess makes one)")
	}
	o.Prefix = etcdkeys.OrDefault(o.Prefix)
	if err := etcdkeys.CheckPrefix(o.Prefix); err != nil {
		return nil, fmt.Errorf("idgen: BlockOptions.Prefix: %w", err)
	}
	if o.MaxBlockSize < o.BlockSize {
		o.MaxBlockSize = o.BlockSize
	}
	if o.TargetDuration <= 0 {
		o.TargetDuration = 15 * time.Minute
	}
	b := &Blocks{cli: cli, key: etcdkeys.IDRangeNextKey(o.Prefix, o.Namespace, o.Name), opts: o}
	b.ctx, b.close = context.WithCancel(context.Background())
	b.size.Store(o.BlockSize)
	empty := &segment{last: -1, prefetchAt: -1}
	empty.next.Store(0)
	b.cur.Store(empty)
	return b, nil
}

// Close stops any block fetch in flight. IDs of claimed blocks not yet
// handed out are skipped, never reissued.
func (b *Blocks) Close() { b.close() }

// Next returns a unique ID.
func (b *Blocks) Next(ctx context.Context) (int64, error) {
	for {
		s := b.cur.Load()
		// Calls past the end keep adding; at the top of int64 that wraps,
		// and the first bound keeps a wrapped counter from issuing.
		if id := s.next.Add(1) - 1; id >= s.first && id <= s.last {
			if id == s.prefetchAt {
				b.startPrefetch()
			}
			return id, nil
		}
		if err := b.advance(ctx, s); err != nil {
			return 0, err
		}
	}
}

// advance replaces the used-up segment s with the prefetched one, waiting
// for (or doing) the fetch if it is not there yet.
func (b *Blocks) advance(ctx context.Context, s *segment) error {
	b.mu.Lock()
	if b.cur.Load() != s {
		b.mu.Unlock()
		return nil // another goroutine advanced already
	}
	if b.pre == nil && b.wait == nil {
		b.startPrefetchLocked()
	}
	wait := b.wait
	b.mu.Unlock()
	if wait != nil {
		select {
		case <-wait:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cur.Load() != s {
		return nil
	}
	if b.pre == nil {
		err := b.err
		b.err = nil
		if err == nil {
			err = errors.New("idgen: block fetch did not complete")
		}
		return err
	}
	b.adapt(s)
	b.cur.Store(b.pre)
	b.pre = nil
	return nil
}

func (b *Blocks) startPrefetch() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.pre == nil && b.wait == nil {
		b.startPrefetchLocked()
	}
}

func (b *Blocks) startPrefetchLocked() {
	done := make(chan struct{})
	b.wait = done
	go func() {
		ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
		seg, err := b.claim(ctx, b.size.Load())
		cancel()
		b.mu.Lock()
		b.pre, b.err, b.wait = seg, err, nil
		b.mu.Unlock()
		close(done)
	}()
}

// adapt resizes future blocks from how long the used-up one lasted.
func (b *Blocks) adapt(used *segment) {
	if !b.opts.Adaptive || used.claimedAt.IsZero() {
		return
	}
	lasted := time.Since(used.claimedAt)
	size := b.size.Load()
	switch {
	case lasted < b.opts.TargetDuration/2 && size <= b.opts.MaxBlockSize/2:
		b.size.Store(size * 2)
	case lasted < b.opts.TargetDuration/2:
		b.size.Store(b.opts.MaxBlockSize)
	case lasted > 2*b.opts.TargetDuration && size/2 >= b.opts.BlockSize:
		b.size.Store(size / 2)
	}
}

// raiseClaimedTo records next as set by this allocator, if it is the
// highest yet (a prefetch and a slow path may claim at once).
func (b *Blocks) raiseClaimedTo(next int64) {
	for {
		cur := b.claimedTo.Load()
		if next <= cur || b.claimedTo.CompareAndSwap(cur, next) {
			return
		}
	}
}

// claim takes the next block with the shared Claim transaction, without the
// controller's election fence, which concerns only the controller.
func (b *Blocks) claim(ctx context.Context, size int64) (*segment, error) {
	for {
		c := Claim{Cli: b.cli, Key: b.key, Min: b.opts.Min, Max: b.opts.Max, Size: size, Seen: b.claimedTo.Load()}
		blk, claimed, _, err := c.Try(ctx)
		if err != nil {
			return nil, err
		}
		if claimed {
			b.raiseClaimedTo(blk.Last + 1)
			s := &segment{first: blk.First, last: blk.Last, prefetchAt: blk.First + (blk.Last-blk.First+1)/10, claimedAt: time.Now()}
			s.next.Store(blk.First)
			return s, nil
		}
	}
}
