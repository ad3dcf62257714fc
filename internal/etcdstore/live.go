package etcdstore

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-io/fencer/internal/etcdreply"
)

// Live is a lease key as a linearizable read saw it.
type Live struct {
	// Grant is the live grant, nil if the lease is not held.
	Grant *Grant
	// Revision is etcd's revision at the read: no token above it had been
	// issued when the read was served.
	Revision int64
	// Unissued is the token of a lease key the controller did not create
	// (Grant.Unissued), 0 if none: the lease counts as not held.
	Unissued int64
}

// MaxReadsInFlight bounds the batches a LiveReader reads at once. Below it
// every question starts a read at once; at it, questions wait together for
// the next free slot, whose read serves all of them. (A batch of more than
// leasesPerTxn Leases is several transactions, sent together.)
const MaxReadsInFlight = 4

// leasesPerTxn bounds the leases one etcd transaction reads: two
// operations each, under etcd's default --max-txn-ops of 128. An etcd run
// with a lower limit refuses such a transaction (ErrTooManyOps); the
// reader then halves its chunks until etcd takes them, and keeps the
// smaller size.
const leasesPerTxn = 64

// LiveReader answers "what is the live token of this lease?" authoritatively
// and cheaply under load. Each answer comes from a linearizable read that
// started after the question was asked, so it can never miss a grant that
// happened before.
//
// Reads are shared across Leases and pipelined: a question joins the batch
// of questions that no read has taken yet, whatever its Lease, and a batch
// is read as soon as fewer than MaxReadsInFlight reads are in flight, in
// one etcd transaction per leasesPerTxn Leases. So one question alone
// waits for one read, not for the one before it; many questions share a
// few reads; and etcd sees at most MaxReadsInFlight batches at once.
type LiveReader struct {
	store *Store
	// observe, if set, records each etcd read's latency.
	observe func(d time.Duration, err error)

	// perTxn is how many Leases one transaction reads: leasesPerTxn,
	// less once etcd refused that many operations.
	perTxn atomic.Int64

	mu       sync.Mutex
	inflight int
	pending  *batch // taken by no read yet; collects questions

	// beforeRead, in tests, runs as a read takes its batch.
	beforeRead func(b *batch)
}

// batch is the questions one read answers: one result per Lease.
type batch struct {
	reads map[leaseRef]*liveRead
	order []leaseRef
}

type leaseRef struct{ namespace, name string }

type liveRead struct {
	done chan struct{}
	live Live
	err  error
}

// NewLiveReader reads through store; observe may be nil.
func NewLiveReader(store *Store, observe func(d time.Duration, err error)) *LiveReader {
	r := &LiveReader{store: store, observe: observe}
	r.perTxn.Store(leasesPerTxn)
	return r
}

// Lookup returns the live state of namespace/name.
func (r *LiveReader) Lookup(ctx context.Context, namespace, name string) (Live, error) {
	ref := leaseRef{namespace, name}
	r.mu.Lock()
	if r.pending == nil {
		r.pending = &batch{reads: map[leaseRef]*liveRead{}}
	}
	b := r.pending
	rd := b.reads[ref]
	if rd == nil {
		rd = &liveRead{done: make(chan struct{})}
		b.reads[ref] = rd
		b.order = append(b.order, ref)
	}
	// Taken under the lock: no question joins a batch once a read has
	// taken it, so every read starts after each of its questions arrived.
	start := r.inflight < MaxReadsInFlight
	if start {
		r.pending = nil
		r.inflight++
	}
	r.mu.Unlock()
	if start {
		go r.run(b)
	}
	select {
	case <-rd.done:
		return rd.live, rd.err
	case <-ctx.Done():
		return Live{}, ctx.Err()
	}
}

// run reads b, then whatever batch collected while every read was in
// flight, until none is left.
func (r *LiveReader) run(b *batch) {
	for b != nil {
		r.read(b)
		r.mu.Lock()
		b, r.pending = r.pending, nil
		if b == nil {
			r.inflight--
		}
		r.mu.Unlock()
	}
}

// read answers every question of b from linearizable reads started now:
// one transaction per perTxn Leases, all at once.
func (r *LiveReader) read(b *batch) {
	// Not a caller's context: the read serves every caller on it.
	if r.beforeRead != nil {
		r.beforeRead(b)
	}
	ctx, cancel := r.store.bound(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	per := int(r.perTxn.Load())
	for from := 0; from < len(b.order); from += per {
		chunk := b.order[from:min(from+per, len(b.order))]
		wg.Go(func() {
			lives, err := r.readChunk(ctx, chunk)
			for i, ref := range chunk {
				rd := b.reads[ref]
				if err != nil {
					rd.err = err
				} else {
					rd.live, rd.err = lives[i].live, lives[i].err
				}
				close(rd.done)
			}
		})
	}
	wg.Wait()
}

// readChunk reads refs in one transaction, or, when etcd refuses that many
// operations in one (a --max-txn-ops below 2*leasesPerTxn), in two halves,
// each a linearizable read that started after every question arrived.
func (r *LiveReader) readChunk(ctx context.Context, refs []leaseRef) ([]liveResult, error) {
	start := time.Now()
	lives, err := r.store.readLives(ctx, refs)
	if r.observe != nil {
		r.observe(time.Since(start), err)
	}
	if !errors.Is(err, rpctypes.ErrTooManyOps) || len(refs) == 1 {
		return lives, err
	}
	half := len(refs) / 2
	// Later batches start at a size etcd may take: half of a full chunk
	// refused, or less than a shorter (last) chunk refused.
	for {
		cur := r.perTxn.Load()
		next := int64(len(refs) - 1)
		if int64(len(refs)) >= cur {
			next = int64(half)
		}
		if cur <= next || r.perTxn.CompareAndSwap(cur, next) {
			break
		}
	}
	first, err := r.readChunk(ctx, refs[:half])
	if err != nil {
		return nil, err
	}
	second, err := r.readChunk(ctx, refs[half:])
	if err != nil {
		return nil, err
	}
	return append(first, second...), nil
}

// liveResult is one Lease's answer: a key that holds malformed JSON is an
// error for that Lease alone.
type liveResult struct {
	live Live
	err  error
}

// readLives reads the lease keys and grant markers of refs in one
// linearizable transaction.
func (s *Store) readLives(ctx context.Context, refs []leaseRef) ([]liveResult, error) {
	ops := make([]clientv3.Op, 0, 2*len(refs))
	for _, ref := range refs {
		ops = append(ops, s.leaseReads(ref)...)
	}
	resp, err := s.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return nil, err
	}
	return livesOf(refs, resp)
}

// livesOf reads refs' grants from the answer to readLives' transaction. An
// answer that does not match the question (no header, responses missing or
// of another kind) is an error for every Lease in it, never a panic: the
// reviews waiting on it are refused with it, and no read slot is lost.
func livesOf(refs []leaseRef, resp *clientv3.TxnResponse) ([]liveResult, error) {
	if err := etcdreply.Txn(resp, 2*len(refs)); err != nil {
		return nil, err
	}
	out := make([]liveResult, len(refs))
	for i, ref := range refs {
		keys, markers, err := leaseReadsAt(resp, 2*i, ref)
		if err != nil {
			return nil, err
		}
		g, err := grantOf(keys, markers)
		out[i] = liveResult{live: liveOf(g, resp.Header.Revision), err: err}
	}
	return out, nil
}
