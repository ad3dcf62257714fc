package etcdstore

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
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
