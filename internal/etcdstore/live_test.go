package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-io/fencer/pkg/etcdkeys"
)

// TestLiveReaderReadsAfterArrival: every caller's answer comes from a read
// that started after it asked. Each caller first writes a key of its own and
// then looks up; the answer's revision must be at least that write's, even
// while hundreds of lookups share reads.
func TestLiveReaderReadsAfterArrival(t *testing.T) {
	cli := startEtcd(t)
	ctx := context.Background()
	e, _ := win(t, cli, "a")
	s := NewStore(cli, DefaultPrefix, e, nil)
	g, err := s.GrantLease(ctx, "ns", "l", "lease-uid", "pod-a", "uid-a", 30*time.Second, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	var reads atomic.Int64
	r := NewLiveReader(s, func(time.Duration, error) { reads.Add(1) })

	const callers = 300
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			put, err := cli.Put(ctx, fmt.Sprintf("/test/bump/%d", i), "x")
			if err != nil {
				errs <- err
				return
			}
			live, err := r.Lookup(ctx, "ns", "l")
			if err != nil {
				errs <- err
				return
			}
			if live.Revision < put.Header.Revision {
				errs <- fmt.Errorf("caller %d wrote at revision %d but was answered by a read at %d", i, put.Header.Revision, live.Revision)
			}
			if live.Grant == nil || live.Grant.Token != g.Token {
				errs <- fmt.Errorf("caller %d: grant %+v, want token %d", i, live.Grant, g.Token)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	t.Logf("%d lookups served by %d etcd reads", callers, reads.Load())
	if reads.Load() > callers {
		t.Fatalf("%d reads for %d lookups", reads.Load(), callers)
	}
}

func TestLiveReaderUnheldAndCancelled(t *testing.T) {
	cli := startEtcd(t)
	e, _ := win(t, cli, "a")
	r := NewLiveReader(NewStore(cli, DefaultPrefix, e, nil), nil)
	live, err := r.Lookup(context.Background(), "ns", "nobody")
	if err != nil || live.Grant != nil || live.Revision == 0 {
		t.Fatalf("unheld lease: %+v, %v", live, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := r.Lookup(ctx, "ns", "nobody"); err == nil {
		t.Fatal("a cancelled lookup returned no error")
	}
}

// Questions about many Leases share reads, and still each is answered by
// a read that started after it arrived: every caller first writes a key,
// and its answer's revision must be at or past that write's. A read that
// failed for one Lease's key (malformed JSON) fails only that Lease.
func TestLiveReaderSharesReadsAcrossLeases(t *testing.T) {
	cli := startEtcd(t)
	ctx := context.Background()
	e, _ := win(t, cli, "a")
	s := NewStore(cli, DefaultPrefix, e, nil)
	const leases = 150 // more than one transaction's worth
	tokens := grantMany(t, s, leases)
	// A key with its grant marker, as a grant writes them, but malformed:
	// decoding it fails, for that Lease alone.
	if _, err := cli.Txn(ctx).Then(clientv3.OpPut(etcdkeys.LeaseKey(DefaultPrefix, "ns", "bad"), "{not json"),
		clientv3.OpPut(etcdkeys.GrantMarkerKey(DefaultPrefix, "ns", "bad"), "")).Commit(); err != nil {
		t.Fatal(err)
	}
	var reads atomic.Int64
	r := NewLiveReader(s, func(time.Duration, error) { reads.Add(1) })
	const callers = 600
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for i := range callers {
		wg.Go(func() {
			if i%50 == 0 {
				if _, err := r.Lookup(ctx, "ns", "bad"); err == nil || !strings.Contains(err.Error(), "malformed JSON") {
					errs <- fmt.Errorf("the malformed key: %w, want its decoding error", err)
				}
			}
			name := fmt.Sprintf("l%d", i%leases)
			put, err := cli.Put(ctx, fmt.Sprintf("/test/bump/%d", i), "x")
			if err != nil {
				errs <- err
				return
			}
			live, err := r.Lookup(ctx, "ns", name)
			switch {
			case err != nil:
				errs <- fmt.Errorf("caller %d (%s): %w", i, name, err)
			case live.Revision < put.Header.Revision:
				errs <- fmt.Errorf("caller %d wrote at revision %d but was answered by a read at %d", i, put.Header.Revision, live.Revision)
			case live.Grant == nil || live.Grant.Token != tokens[name]:
				errs <- fmt.Errorf("caller %d: %s's grant %+v, want token %d", i, name, live.Grant, tokens[name])
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	t.Logf("%d lookups of %d Leases served by %d etcd transactions", callers, leases, reads.Load())
	if reads.Load() >= callers {
		t.Errorf("%d transactions for %d lookups: no read was shared", reads.Load(), callers)
	}
}

// The reader's schedule, step by step, with reads held in a hook: a
// question that arrives while a read is in flight starts a read of its
// own (it is never answered by the read already taken, nor made to wait
// for it), up to MaxReadsInFlight; beyond that, questions about any Lease
// wait together, and one read serves them all.
func TestLiveReaderPipelinesThenBatches(t *testing.T) {
	cli := startEtcd(t)
	ctx := context.Background()
	e, _ := win(t, cli, "a")
	s := NewStore(cli, DefaultPrefix, e, nil)
	tokens := map[string]int64{}
	for i := range 10 {
		name := fmt.Sprintf("l%d", i)
		g, err := s.GrantLease(ctx, "ns", name, "lease-uid", "pod-"+name, "uid-"+name, 30*time.Second, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		tokens[name] = g.Token
	}
	r := NewLiveReader(s, nil)
	started := make(chan []leaseRef, 20)
	release := make(chan struct{})
	r.beforeRead = func(b *batch) {
		started <- append([]leaseRef(nil), b.order...)
		<-release
	}
	errs := make(chan error, 20)
	ask := func(name string) {
		go func() {
			live, err := r.Lookup(ctx, "ns", name)
			switch {
			case err != nil:
				errs <- err
			case live.Grant == nil || live.Grant.Token != tokens[name]:
				errs <- fmt.Errorf("%s: %+v, want token %d", name, live.Grant, tokens[name])
			default:
				errs <- nil
			}
		}()
	}
	next := func(what string) []leaseRef {
		t.Helper()
		select {
		case b := <-started:
			return b
		case <-time.After(5 * time.Second):
			t.Fatalf("no read started: %s", what)
			return nil
		}
	}
	// The same Lease twice, while the first read is held: a second read.
	ask("l0")
	next("the first question")
	ask("l0")
	if b := next("a question while a read of its Lease is in flight"); len(b) != 1 || b[0].name != "l0" {
		t.Fatalf("second read took %v", b)
	}
	ask("l1")
	next("the third question")
	ask("l2")
	next("the fourth question")
	// Four reads in flight: the next questions, of six Leases, wait.
	for i := 3; i < 9; i++ {
		ask(fmt.Sprintf("l%d", i))
	}
	select {
	case b := <-started:
		t.Fatalf("a fifth read started with four in flight: %v", b)
	case <-time.After(300 * time.Millisecond):
	}
	close(release)
	if b := next("the waiting questions, once a read is free"); len(b) != 6 {
		t.Fatalf("the waiting questions were read as %v, want one read of all six Leases", b)
	}
	for range 10 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	// Each read gives its slot back just after it answers.
	waitIdle(t, r)
}

// An etcd run with a --max-txn-ops below the reader's transaction size
// refuses its batched reads (ErrTooManyOps). The reader then splits its
// batches until etcd takes them, answers every question rightly, and keeps
// the smaller size for later batches.
func TestLiveReaderSplitsWhatEtcdRefusesAsTooManyOps(t *testing.T) {
	cli := startEtcd(t, "--max-txn-ops=8") // 4 Leases a transaction
	ctx := context.Background()
	e, _ := win(t, cli, "a")
	s := NewStore(cli, DefaultPrefix, e, nil)
	const leases = 30
	tokens := grantMany(t, s, leases)
	r := NewLiveReader(s, nil)
	// Hold every read slot until all the questions have arrived, so that
	// the next batch holds all 30 Leases.
	release := make(chan struct{})
	var held atomic.Int64
	r.beforeRead = func(*batch) {
		if held.Add(1) <= MaxReadsInFlight {
			<-release
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 2*leases)
	ask := func(name string) {
		live, err := r.Lookup(ctx, "ns", name)
		switch {
		case err != nil:
			errs <- fmt.Errorf("%s: %w", name, err)
		case live.Grant == nil || live.Grant.Token != tokens[name]:
			errs <- fmt.Errorf("%s's grant %+v, want token %d", name, live.Grant, tokens[name])
		}
	}
	for i := range MaxReadsInFlight {
		wg.Go(func() { ask(fmt.Sprintf("l%d", i)) })
		for held.Load() <= int64(i) {
			time.Sleep(time.Millisecond)
		}
	}
	for i := range leases {
		wg.Go(func() { ask(fmt.Sprintf("l%d", i)) })
	}
	// The questions beyond the first read wait in batches; let them pile up.
	time.Sleep(200 * time.Millisecond)
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := r.perTxn.Load(); got > 4 {
		t.Fatalf("the reader reads %d Leases a transaction after etcd refused more than 4", got)
	}
}

// grantMany grants Leases ns/l0..l<n-1>, each to its own pod, and returns
// their tokens by name.
func grantMany(t *testing.T, s *Store, n int) map[string]int64 {
	t.Helper()
	tokens := map[string]int64{}
	for i := range n {
		name := fmt.Sprintf("l%d", i)
		g, err := s.GrantLease(context.Background(), "ns", name, "lease-uid", "pod-"+name, "uid-"+name, 30*time.Second, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		tokens[name] = g.Token
	}
	return tokens
}

// A read that a question starts holds that question alone, and a caller
// that gives up while its read is in flight gets its context's error, not
// a late answer. The questions that collected meanwhile are read together
// once a slot frees, and every slot is given back.
func TestLiveReaderCallerThatGivesUpMidRead(t *testing.T) {
	cli := startEtcd(t)
	ctx := context.Background()
	e, _ := win(t, cli, "a")
	s := NewStore(cli, DefaultPrefix, e, nil)
	tokens := grantMany(t, s, 6)
	r := NewLiveReader(s, nil)
	started := make(chan int, 10)
	release := make(chan struct{})
	letGo := sync.OnceFunc(func() { close(release) })
	t.Cleanup(letGo) // a failed test leaves no read held
	r.beforeRead = func(b *batch) {
		started <- len(b.order)
		<-release
	}
	type answer struct {
		name string
		live Live
		err  error
	}
	answers := make(chan answer, 6)
	ask := func(ctx context.Context, name string) {
		go func() {
			live, err := r.Lookup(ctx, "ns", name)
			answers <- answer{name, live, err}
		}()
	}
	// l0 to l3 take every read slot, each with a read of its own.
	giveUp, cancel := context.WithCancel(ctx)
	ask(giveUp, "l0")
	for i := 1; i < MaxReadsInFlight; i++ {
		ask(ctx, fmt.Sprintf("l%d", i))
	}
	for range MaxReadsInFlight {
		select {
		case n := <-started:
			if n != 1 {
				t.Fatalf("a read started by a question took %d questions, want its own alone", n)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("no read started")
		}
	}
	ask(ctx, "l4")
	ask(ctx, "l5")
	for deadline := time.Now().Add(5 * time.Second); pendingQuestions(r) < 2; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("l4 and l5 never joined the pending batch")
		}
	}
	// The caller gives up while its read is held: its answer comes before
	// the read can end.
	cancel()
	select {
	case a := <-answers:
		if a.name != "l0" || !errors.Is(a.err, context.Canceled) {
			t.Fatalf("after giving up, %s got %+v, %v; want l0 to get context.Canceled", a.name, a.live, a.err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the caller that gave up still waits for its read")
	}
	letGo()
	for range 5 {
		a := <-answers
		switch {
		case a.err != nil:
			t.Errorf("%s: %v", a.name, a.err)
		case a.live.Grant == nil || a.live.Grant.Token != tokens[a.name]:
			t.Errorf("%s: %+v, want token %d", a.name, a.live.Grant, tokens[a.name])
		}
	}
	if n := <-started; n != 2 {
		t.Errorf("the questions that waited were read as %d, want one read of both", n)
	}
	waitIdle(t, r)
}

// waitIdle waits until r has no read in flight and no batch pending: each
// read gives its slot back just after it answers.
func waitIdle(t *testing.T, r *LiveReader) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		r.mu.Lock()
		inflight, pending := r.inflight, r.pending
		r.mu.Unlock()
		if inflight == 0 && pending == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after every answer: %d reads in flight, pending %v", inflight, pending)
		}
	}
}

// pendingQuestions is how many questions wait in r's pending batch.
func pendingQuestions(r *LiveReader) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pending == nil {
		return 0
	}
	return len(r.pending.order)
}

// An answer to the live read that does not match its question is an error
// for the Leases in it, not a panic in the goroutine that read it (which
// would end the manager) or a Live at revision 0.
func TestLivesOfAnAnswerOfTheWrongShape(t *testing.T) {
	refs := []leaseRef{{"ns", "a"}, {"ns", "b"}}
	rng := func() *etcdserverpb.ResponseOp {
		return &etcdserverpb.ResponseOp{Response: &etcdserverpb.ResponseOp_ResponseRange{ResponseRange: &etcdserverpb.RangeResponse{}}}
	}
	put := &etcdserverpb.ResponseOp{Response: &etcdserverpb.ResponseOp_ResponsePut{ResponsePut: &etcdserverpb.PutResponse{}}}
	header := &etcdserverpb.ResponseHeader{Revision: 7}
	for _, c := range []struct {
		name string
		resp *clientv3.TxnResponse
		want string
	}{
		{"no header", &clientv3.TxnResponse{Responses: []*etcdserverpb.ResponseOp{rng(), rng(), rng(), rng()}}, "it has no header"},
		{"a response short", &clientv3.TxnResponse{Header: header, Responses: []*etcdserverpb.ResponseOp{rng(), rng(), rng()}}, "4 operations was answered with 3 responses"},
		{"a put where a range was asked", &clientv3.TxnResponse{Header: header, Responses: []*etcdserverpb.ResponseOp{rng(), rng(), rng(), put}}, "lease ns/b: etcd's answer does not match its request: operation 3, a range read, was answered with another kind"},
		{"a nil response", &clientv3.TxnResponse{Header: header, Responses: []*etcdserverpb.ResponseOp{nil, rng(), rng(), rng()}}, "lease ns/a: etcd's answer does not match its request: operation 0"},
	} {
		t.Run(c.name, func(t *testing.T) {
			lives, err := livesOf(refs, c.resp)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %+v, %v; want an error naming %q", lives, err, c.want)
			}
		})
	}
	lives, err := livesOf(refs, &clientv3.TxnResponse{Header: header, Responses: []*etcdserverpb.ResponseOp{rng(), rng(), rng(), rng()}})
	if err != nil || len(lives) != 2 || lives[0].live.Revision != 7 || lives[1].live.Grant != nil {
		t.Fatalf("a well-formed answer with no keys: %+v, %v; want two unheld Leases at revision 7", lives, err)
	}
}
