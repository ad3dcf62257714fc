package etcdstore

import (
	"context"
	"sync"
	"time"

	"github.com/fencer-io/fencer/pkg/etcdkeys"
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

// LiveReader answers "what is the live token of this lease?" authoritatively
// and cheaply under load. Each answer comes from a linearizable read that
// started after the question was asked, so it can never miss a grant that
// happened before; concurrent questions about one key share reads. While a
// read is in flight, new callers wait for the next read, which starts when
// the current one ends and serves all of them.
type LiveReader struct {
	store *Store
	// observe, if set, records each etcd read's latency.
	observe func(d time.Duration, err error)

	mu   sync.Mutex
	keys map[string]*readState
}

type readState struct {
	inflight *liveRead // started; callers that arrived before it began are on it
	next     *liveRead // not started yet; collects callers that arrive meanwhile
}

type liveRead struct {
	done chan struct{}
	live Live
	err  error
}

// NewLiveReader reads through store; observe may be nil.
func NewLiveReader(store *Store, observe func(d time.Duration, err error)) *LiveReader {
	return &LiveReader{store: store, observe: observe, keys: map[string]*readState{}}
}

// Lookup returns the live state of namespace/name.
func (r *LiveReader) Lookup(ctx context.Context, namespace, name string) (Live, error) {
	key := etcdkeys.LeaseKey(r.store.prefix, namespace, name)
	r.mu.Lock()
	st := r.keys[key]
	if st == nil {
		st = &readState{}
		r.keys[key] = st
	}
	var rd *liveRead
	start := false
	switch {
	case st.inflight == nil:
		rd = &liveRead{done: make(chan struct{})}
		st.inflight, start = rd, true
	case st.next != nil:
		rd = st.next
	default:
		rd = &liveRead{done: make(chan struct{})}
		st.next = rd
	}
	r.mu.Unlock()
	if start {
		go r.run(key, namespace, name, rd)
	}
	select {
	case <-rd.done:
		return rd.live, rd.err
	case <-ctx.Done():
		return Live{}, ctx.Err()
	}
}

// run serves rd, then whatever read queued behind it, until none is left.
func (r *LiveReader) run(key, namespace, name string, rd *liveRead) {
	for rd != nil {
		// Not a caller's context: the read serves every caller on it.
		ctx, cancel := r.store.bound(context.Background())
		start := time.Now()
		rd.live, rd.err = r.store.readLive(ctx, namespace, name)
		cancel()
		if r.observe != nil {
			r.observe(time.Since(start), rd.err)
		}
		close(rd.done)

		r.mu.Lock()
		st := r.keys[key]
		st.inflight, st.next = st.next, nil
		rd = st.inflight
		if rd == nil {
			delete(r.keys, key)
		}
		r.mu.Unlock()
	}
}
