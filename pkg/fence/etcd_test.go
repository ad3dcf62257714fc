package fence

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/fencer-io/fencer/pkg/etcdkeys"
	"github.com/fencer-io/fencer/test/support/testenv"
)

const prefix = etcdkeys.DefaultPrefix

func startEtcd(t *testing.T) string { return startEtcdB(t) }

func startEtcdB(t testing.TB) string { return testenv.Etcd(t) }

func connect(t *testing.T, endpoint string) *clientv3.Client { return connectB(t, endpoint) }

func connectB(t testing.TB, endpoint string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// grant writes a lease key as fencer's controller would, attached to an
// etcd lease of ttl, and returns the holder's token.
func grant(t *testing.T, cli *clientv3.Client, lease string, ttl int64) Token {
	return grantB(t, cli, lease, ttl)
}

func grantB(t testing.TB, cli *clientv3.Client, lease string, ttl int64) Token {
	t.Helper()
	ctx := context.Background()
	l, err := cli.Grant(ctx, ttl)
	if err != nil {
		t.Fatal(err)
	}
	return Token{Lease: lease, Value: putGrant(t, cli, "ns", lease, `{"holder":"me"}`, l.ID), LeaseID: int64(l.ID)}
}

// putGrant writes a lease key holding value, attached to etcd lease id, and
// its grant marker, in one transaction, as fencer's controller does, and
// returns the token.
func putGrant(t testing.TB, cli *clientv3.Client, namespace, lease, value string, id clientv3.LeaseID) int64 {
	t.Helper()
	resp, err := cli.Txn(context.Background()).Then(
		clientv3.OpPut(etcdkeys.LeaseKey(prefix, namespace, lease), value, clientv3.WithLease(id)),
		clientv3.OpPut(etcdkeys.GrantMarkerKey(prefix, namespace, lease), ""),
	).Commit()
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

func TestFencedTxn(t *testing.T) {
	cli := connect(t, startEtcd(t))
	ctx := context.Background()
	old := grant(t, cli, "job", 30)
	if _, err := NewTxn(cli, prefix, "ns", old).Then(clientv3.OpPut("/data/x", "by old")).Commit(ctx); err != nil {
		t.Fatalf("live token: %v", err)
	}
	// A new grant replaces the key: the old token is fenced off.
	if _, err := cli.Delete(ctx, etcdkeys.LeaseKey(prefix, "ns", "job")); err != nil {
		t.Fatal(err)
	}
	nu := grant(t, cli, "job", 30)
	_, err := NewTxn(cli, prefix, "ns", old).Then(clientv3.OpPut("/data/x", "stale")).Commit(ctx)
	var fenced *FencedError
	if !errors.As(err, &fenced) || fenced.Offered != old.Value || fenced.Current != nu.Value {
		t.Fatalf("stale txn: %v, want a FencedError offering %d with current %d", err, old.Value, nu.Value)
	}
	got, err := cli.Get(ctx, "/data/x")
	if err != nil || string(got.Kvs[0].Value) != "by old" {
		t.Fatalf("a fenced-off txn wrote: %v %v", got, err)
	}
}

// proxy forwards TCP to target until paused, as a network partition or a
// paused process would cut a client off, or stalled: its connections stay
// open and carry nothing, as a partition that drops packets does, until
// flow.
type proxy struct {
	l      net.Listener
	target string
	mu     sync.Mutex
	paused bool
	conns  []net.Conn
	// stalled, while not nil, holds every byte back until it is closed.
	stalled chan struct{}
}

func newProxy(t *testing.T, target string) *proxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{l: l, target: target}
	t.Cleanup(func() { l.Close() })
	go p.serve()
	return p
}

func (p *proxy) URL() string { return "http://" + p.l.Addr().String() }

func (p *proxy) serve() {
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		paused := p.paused
		p.mu.Unlock()
		if paused {
			c.Close()
			continue
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, up)
		p.mu.Unlock()
		go p.pipe(up, c)
		go p.pipe(c, up)
	}
}

// pipe copies src to dst, holding each read back while the proxy stalls.
func (p *proxy) pipe(dst, src net.Conn) {
	defer dst.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			stalled := p.stalled
			p.mu.Unlock()
			if stalled != nil {
				<-stalled
			}
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// stall holds every byte back on the open connections, which stay open.
func (p *proxy) stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stalled == nil {
		p.stalled = make(chan struct{})
	}
}

// flow lets the bytes a stall held back through.
func (p *proxy) flow() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stalled != nil {
		close(p.stalled)
		p.stalled = nil
	}
}

func (p *proxy) pause() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.paused = true
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// resume lets connections through again.
func (p *proxy) resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.paused = false
}

// TestHoldCancelsWithinOneTTLWhenCutOff: a holder whose keepalives stop
// getting through loses its context within one TTL of its last renewal,
// measured from when the last successful renewal was sent, so never after
// etcd itself expires the lease.
func TestHoldCancelsWithinOneTTLWhenCutOff(t *testing.T) {
	endpoint := startEtcd(t)
	admin := connect(t, endpoint)
	p := newProxy(t, endpoint[len("http://"):])
	holder := connect(t, p.URL())
	tok := grant(t, admin, "job", 2)

	held, err := Hold(context.Background(), holder, prefix, "ns", tok)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second) // past the TTL: Hold is renewing
	if held.Err() != nil {
		t.Fatalf("lost while renewing: %v", context.Cause(held))
	}
	ttl, err := admin.TimeToLive(context.Background(), clientv3.LeaseID(tok.LeaseID))
	if err != nil || ttl.TTL <= 0 {
		t.Fatalf("lease not kept alive: %+v %v", ttl, err)
	}

	cut := time.Now()
	p.pause()
	select {
	case <-held.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Hold never noticed it was cut off")
	}
	lostAfter := time.Since(cut)
	if !errors.Is(context.Cause(held), ErrLeaseLost) {
		t.Fatalf("cause %v, want ErrLeaseLost", context.Cause(held))
	}
	// Within one TTL (2 s) of the last renewal, which was before the cut;
	// the extra second only absorbs scheduling on a loaded machine.
	if lostAfter > 3*time.Second {
		t.Fatalf("Hold noticed the loss %s after the cut, later than one TTL", lostAfter)
	}
	t.Logf("Hold cancelled %s after keepalives were cut (TTL 2s)", lostAfter.Round(time.Millisecond))
}

func TestHoldCancelsWhenTheKeyIsRegranted(t *testing.T) {
	cli := connect(t, startEtcd(t))
	tok := grant(t, cli, "job", 30)
	held, err := Hold(context.Background(), cli, prefix, "ns", tok)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Delete(context.Background(), etcdkeys.LeaseKey(prefix, "ns", "job")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-held.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Hold missed the key's deletion")
	}
	if _, err := Hold(context.Background(), cli, prefix, "ns", tok); err == nil {
		t.Fatal("Hold accepted a token whose key is gone")
	}
	if _, err := Hold(context.Background(), cli, prefix, "ns", Token{Lease: "job", Value: tok.Value}); err == nil {
		t.Fatal("Hold accepted a token without a lease ID")
	}
}

// A token whose lease ID is not the grant's (an annotation edited, or a
// lease ID copied from another pod's) is refused: Hold would renew some
// other grant's etcd lease, and let this one expire under its holder.
func TestHoldRefusesALeaseIDThatIsNotTheGrants(t *testing.T) {
	cli := connect(t, startEtcd(t))
	tok := grant(t, cli, "job", 30)
	other := grant(t, cli, "other", 30)
	forged := tok
	forged.LeaseID = other.LeaseID
	if _, err := Hold(context.Background(), cli, prefix, "ns", forged); err == nil || !strings.Contains(err.Error(), "not on lease") {
		t.Fatalf("Hold of a token naming another grant's etcd lease: %v, want a refusal", err)
	}
	held, err := Hold(context.Background(), cli, prefix, "ns", tok)
	if err != nil {
		t.Fatalf("Hold of the genuine token: %v", err)
	}
	if held.Err() != nil {
		t.Fatal("the genuine token's hold ended at once")
	}
}

// TestReleaseEndsOnlyItsOwnGrant: Release deletes the key while the token
// is live, and a stale token (the old holder's unlock arriving after a new
// grant) deletes nothing.
func TestReleaseEndsOnlyItsOwnGrant(t *testing.T) {
	cli := connect(t, startEtcd(t))
	ctx := context.Background()
	key := etcdkeys.LeaseKey(prefix, "ns", "job")
	old := grant(t, cli, "job", 30)
	if err := Release(ctx, cli, prefix, "ns", old); err != nil {
		t.Fatalf("Release of the live token: %v", err)
	}
	if resp, _ := cli.Get(ctx, key); len(resp.Kvs) != 0 {
		t.Fatal("Release left the key")
	}
	next := grant(t, cli, "job", 30)
	var fenced *FencedError
	if err := Release(ctx, cli, prefix, "ns", old); !errors.As(err, &fenced) || fenced.Current != next.Value {
		t.Fatalf("a stale Release: %v, want a FencedError naming token %d", err, next.Value)
	}
	if resp, _ := cli.Get(ctx, key); len(resp.Kvs) != 1 || resp.Kvs[0].CreateRevision != next.Value {
		t.Fatal("a stale Release ended the next holder's grant")
	}
	if err := Release(ctx, cli, prefix, "ns", Token{Lease: "job", Value: next.Value}); err == nil {
		t.Fatal("Release accepted a token without an etcd lease ID (not renewal: Direct)")
	}
}

// TestTxnRefusesARewrittenKey: a lease key rewritten in place keeps its
// CreateRevision, so the token still matches; but fencer writes a grant
// once, and a rewritten key (as a namespace identity could make of a
// Direct lease's key) fences everything off.
func TestTxnRefusesARewrittenKey(t *testing.T) {
	cli := connect(t, startEtcd(t))
	ctx := context.Background()
	tok := grant(t, cli, "job", 30)
	if _, err := cli.Put(ctx, etcdkeys.LeaseKey(prefix, "ns", "job"), `{"holder":"intruder"}`); err != nil {
		t.Fatal(err)
	}
	_, err := NewTxn(cli, prefix, "ns", tok).Then(clientv3.OpPut("/data/x", "1")).Commit(ctx)
	var fenced *FencedError
	if !errors.As(err, &fenced) || fenced.Current != 0 {
		t.Fatalf("a write under a rewritten key: %v, want a FencedError with no current token", err)
	}
}

// TestAKeyCreatedAgainIsNoGrant: something that may write a lease key (a
// Direct holder may write its own, to renew it) deletes it and creates it
// again, detached from any etcd lease. Its new revision is no token: the
// controller wrote no grant marker with it. The fence, EtcdHeld and Hold
// refuse it, and the real holder's refusal names no current token.
func TestAKeyCreatedAgainIsNoGrant(t *testing.T) {
	cli := connect(t, startEtcd(t))
	ctx := context.Background()
	real := grant(t, cli, "job", 30)
	key := etcdkeys.LeaseKey(prefix, "ns", "job")
	if _, err := cli.Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
	put, err := cli.Put(ctx, key, `{"holder":"forger","holderUID":"uid-forger"}`)
	if err != nil {
		t.Fatal(err)
	}
	forged := Token{Lease: "job", Value: put.Header.Revision, LeaseID: int64(real.LeaseID)}
	for _, tok := range []Token{forged, real} {
		_, err := NewTxn(cli, prefix, "ns", tok).Then(clientv3.OpPut("/data/x", "1")).Commit(ctx)
		var fenced *FencedError
		if !errors.As(err, &fenced) || fenced.Current != 0 {
			t.Fatalf("a write under token %d, the key created again by another: %v, want a FencedError with no current token", tok.Value, err)
		}
	}
	if got, err := cli.Get(ctx, "/data/x"); err != nil || len(got.Kvs) != 0 {
		t.Fatalf("a fenced-off write landed: %v %v", got, err)
	}
	if err := (EtcdHeld{Client: cli, Prefix: prefix, Namespace: "ns", PodUID: "uid-forger"}).Held(ctx, forged); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("EtcdHeld of the key created again: %v, want ErrLeaseLost", err)
	}
	var fenced *FencedError
	if _, err := Hold(ctx, cli, prefix, "ns", forged); !errors.As(err, &fenced) || fenced.Current != 0 {
		t.Fatalf("Hold of the key created again: %v, want a FencedError with no current token", err)
	}
}

// TestWatchHeldSeesThroughCompaction: a watch that must resume from a
// compacted revision re-reads the key instead of going blind, so a grant
// still held is not reported lost, and its deletion afterwards is seen.
func TestWatchHeldSeesThroughCompaction(t *testing.T) {
	cli := connect(t, startEtcd(t))
	ctx := context.Background()
	put, err := cli.Put(ctx, "/compaction/held", "x")
	if err != nil {
		t.Fatal(err)
	}
	token := put.Header.Revision
	var last int64
	for i := range 20 {
		r, err := cli.Put(ctx, "/compaction/other", strconv.Itoa(i))
		if err != nil {
			t.Fatal(err)
		}
		last = r.Header.Revision
	}
	if _, err := cli.Compact(ctx, last); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { done <- WatchHeld(wctx, cli, "/compaction/held", token, token) }() // resumes from a compacted revision
	select {
	case err := <-done:
		t.Fatalf("a grant still held was reported: %v", err)
	case <-time.After(time.Second): // it keeps watching
	}
	if _, err := cli.Delete(ctx, "/compaction/held"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("got %v, want ErrLeaseLost", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the deletion after a compaction was never seen")
	}
}

// Without an etcd client the SDK's etcd calls say what is missing instead
// of panicking in the caller.
func TestEtcdCallsWithoutAClient(t *testing.T) {
	ctx := context.Background()
	tok := Token{Lease: "job", Value: 5, LeaseID: 7}
	if _, err := NewTxn(nil, prefix, "ns", tok).Commit(ctx); !errors.Is(err, ErrMisconfigured) {
		t.Errorf("NewTxn(nil).Commit: %v", err)
	}
	if _, err := Hold(ctx, nil, prefix, "ns", tok); !errors.Is(err, ErrMisconfigured) {
		t.Errorf("Hold(nil): %v", err)
	}
	if err := (EtcdHeld{Namespace: "ns"}).Held(ctx, tok); !errors.Is(err, ErrMisconfigured) {
		t.Errorf("EtcdHeld without a client: %v", err)
	}
}
