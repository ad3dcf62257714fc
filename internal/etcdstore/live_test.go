package etcdstore

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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
	g, err := s.GrantLease(ctx, "ns", "l", "pod-a", "uid-a", 30*time.Second, time.Now())
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
	tokens := map[string]int64{}
	for i := range leases {
		name := fmt.Sprintf("l%d", i)
		g, err := s.GrantLease(ctx, "ns", name, "pod-"+name, "uid-"+name, 30*time.Second, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		tokens[name] = g.Token
	}
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
