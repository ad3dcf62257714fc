package fence

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	fencerv1alpha1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
)

func fakeClient(objs ...client.Object) client.Client {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(fencerv1alpha1.AddToScheme(s))
	return fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).WithStatusSubresource(&fencerv1alpha1.Lease{}).Build()
}

// A pod replaced by one of the same name (a StatefulSet's, after a force
// delete) must never read its successor's token as its own.
func TestPodSourceMatchesTheUID(t *testing.T) {
	successor := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "db-0", Namespace: "ns", UID: "new",
		Annotations: map[string]string{TokenAnnotationPrefix + "report": "9"}}}
	c := fakeClient(successor)
	ctx := context.Background()
	if _, err := (PodSource{Client: c, Namespace: "ns", Pod: "db-0", UID: "old", Lease: "report"}).Token(ctx); !errors.Is(err, ErrNotHolder) {
		t.Fatalf("the old pod read its successor's token: %v", err)
	}
	if tok, err := (PodSource{Client: c, Namespace: "ns", Pod: "db-0", UID: "new", Lease: "report"}).Token(ctx); err != nil || tok.Value != 9 {
		t.Fatalf("the successor reads %+v, %v", tok, err)
	}
	if _, err := (PodSource{Client: c, Namespace: "ns", Pod: "db-0", Lease: "report"}).Token(ctx); err == nil || errors.Is(err, ErrNotHolder) {
		t.Fatalf("a PodSource without UID: want a configuration error, got %v", err)
	}
}

func statusLease(holder, uid string, tok int64) *fencerv1alpha1.Lease {
	l := &fencerv1alpha1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "report", Namespace: "ns"}}
	l.Status.Holder, l.Status.HolderUID, l.Status.Token = holder, types.UID(uid), tok
	return l
}

func TestLeaseSourceMatchesTheUID(t *testing.T) {
	c := fakeClient(statusLease("db-0", "new", 9))
	ctx := context.Background()
	if _, err := (LeaseSource{Client: c, Namespace: "ns", Lease: "report", Pod: "db-0", UID: "old"}).Token(ctx); !errors.Is(err, ErrNotHolder) {
		t.Fatalf("the old pod read its successor's token: %v", err)
	}
	if tok, err := (LeaseSource{Client: c, Namespace: "ns", Lease: "report", Pod: "db-0", UID: "new"}).Token(ctx); err != nil || tok.Value != 9 {
		t.Fatalf("the successor reads %+v, %v", tok, err)
	}
	if _, err := (LeaseSource{Client: c, Namespace: "ns", Lease: "report", Pod: "db-0"}).Token(ctx); err == nil || errors.Is(err, ErrNotHolder) {
		t.Fatalf("a LeaseSource without UID: want a configuration error, got %v", err)
	}
}

// A token carries an etcd lease ID only for a Direct holder, which renews
// it itself (Hold). Under PodReady the status's leaseID is the
// controller's etcd lease, which the pod must never renew.
func TestLeaseSourceGivesTheEtcdLeaseOnlyToADirectHolder(t *testing.T) {
	ctx := context.Background()
	for renewal, want := range map[fencerv1alpha1.RenewalMode]int64{fencerv1alpha1.RenewalPodReady: 0, fencerv1alpha1.RenewalDirect: 77} {
		l := statusLease("db-0", "me", 9)
		l.Spec.Renewal, l.Status.LeaseID = renewal, 77
		tok, err := (LeaseSource{Client: fakeClient(l), Namespace: "ns", Lease: "report", Pod: "db-0", UID: "me"}).Token(ctx)
		if err != nil || tok.LeaseID != want {
			t.Errorf("%s: Token = %+v, %v; want LeaseID %d", renewal, tok, err, want)
		}
	}
}

// An annotation that stays (its pod's kubelet has stopped, or the
// controller cannot patch it) must not keep RunExclusive's work going once
// the grant has ended: the status check cancels it.
func TestRunExclusiveFollowsTheStatus(t *testing.T) {
	c := fakeClient(statusLease("w-0", "me", 9))
	src := Verified{Source: FileSource{Path: annotationsFile(t, 9), Lease: "report"}, Check: StatusHeld{Client: c, Namespace: "ns", PodUID: "me", Interval: 10 * time.Millisecond}}
	done := runExclusive(t, src, 9)
	// The grant moves on; the annotation file does not change.
	l := &fencerv1alpha1.Lease{}
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: "ns", Name: "report"}, l); err != nil {
		t.Fatal(err)
	}
	l.Status.Holder, l.Status.HolderUID, l.Status.Token = "w-1", "other", 12
	if err := c.Status().Update(context.Background(), l); err != nil {
		t.Fatal(err)
	}
	wantLost(t, done, 10*time.Second, "the grant ended")
	if _, err := src.Token(context.Background()); !errors.Is(err, ErrNotHolder) {
		t.Fatalf("Verified reads a token whose grant ended: %v", err)
	}
}

// With etcd access, the grant key itself: RunExclusive is cancelled the
// moment the key is deleted, though the annotation never changes, and
// Watch reports the loss.
func TestRunExclusiveFollowsTheGrantInEtcd(t *testing.T) {
	cli := connect(t, startEtcd(t))
	tok := grant(t, cli, "report", 60)
	src := Verified{Source: FileSource{Path: annotationsFile(t, tok.Value), Lease: "report"}, Check: EtcdHeld{Client: cli, Prefix: prefix, Namespace: "ns"}}
	done := runExclusive(t, src, tok.Value)
	watchCtx, stopWatch := context.WithCancel(context.Background())
	defer stopWatch()
	tokens := Watch(watchCtx, src, "report", 20*time.Millisecond)
	if first := <-tokens; first.Value != tok.Value {
		t.Fatalf("Watch first sent %+v", first)
	}
	if _, err := cli.Delete(context.Background(), etcdkeys.LeaseKey(prefix, "ns", "report")); err != nil {
		t.Fatal(err)
	}
	wantLost(t, done, 10*time.Second, "the grant key was deleted")
	select {
	case lost := <-tokens:
		if lost.Value != 0 {
			t.Fatalf("Watch sent %+v after the grant ended, want the zero token", lost)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Watch never reported the lost grant")
	}
}

// annotationsFile writes a Downward API annotations file in which the pod
// holds lease "report" under token and returns its path.
func annotationsFile(t *testing.T, token int64) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "annotations")
	if err := os.WriteFile(path, []byte(`lease.fencer.io/report="`+strconv.FormatInt(token, 10)+`"`), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// runExclusive runs RunExclusive over src for lease "report" in the
// background, its function waiting for its context to end; it waits until
// the function has started with token want and returns where
// RunExclusive's result arrives.
func runExclusive(t *testing.T, src Source, want int64) <-chan error {
	t.Helper()
	started, done := make(chan Token, 1), make(chan error, 1)
	go func() {
		done <- RunExclusive(context.Background(), src, "report", time.Hour, func(ctx context.Context, tok Token) error {
			started <- tok
			<-ctx.Done()
			return ctx.Err()
		})
	}()
	if tok := <-started; tok.Value != want {
		t.Fatalf("ran with %+v, want token %d", tok, want)
	}
	return done
}

// wantLost waits up to within for RunExclusive's result on done, which must
// wrap ErrLeaseLost, after what ended the grant.
func wantLost(t *testing.T, done <-chan error, within time.Duration, what string) {
	t.Helper()
	select {
	case err := <-done:
		if !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("RunExclusive = %v, want ErrLeaseLost", err)
		}
	case <-time.After(within):
		t.Fatalf("RunExclusive kept running %s after %s", within, what)
	}
}

// A source missing the pod's UID is a mistake no retry mends: RunExclusive
// says so at once instead of waiting forever.
func TestRunExclusiveRefusesAMisconfiguredSource(t *testing.T) {
	c := fakeClient(statusLease("w-0", "me", 9))
	for name, src := range map[string]Source{
		"PodSource without UID":   PodSource{Client: c, Namespace: "ns", Pod: "w-0", Lease: "report"},
		"LeaseSource without UID": LeaseSource{Client: c, Namespace: "ns", Pod: "w-0", Lease: "report"},
		"StatusHeld without PodUID": &Verified{Source: LeaseSource{Client: c, Namespace: "ns", Pod: "w-0", UID: "me", Lease: "report"},
			Check: StatusHeld{Client: c, Namespace: "ns"}},
		"FileSource on a path with no file": FileSource{Path: filepath.Join(t.TempDir(), "annotations"), Lease: "report"},
		"FileSource without Path":           FileSource{Lease: "report"},
		"FileSource without Lease":          FileSource{Path: "testdata/simple.annotations"},
		"PodSource without Lease":           PodSource{Client: c, Namespace: "ns", Pod: "w-0", UID: "me"},
		"PodSource without Pod":             PodSource{Client: c, Namespace: "ns", UID: "me", Lease: "report"},
		"LeaseSource without Namespace":     LeaseSource{Client: c, Pod: "w-0", UID: "me", Lease: "report"},
		"LeaseSource without Lease":         LeaseSource{Client: c, Namespace: "ns", Pod: "w-0", UID: "me"},
		// A nil client panicked at the first read, and so did a Verified
		// without its Check, once the pod held the lease.
		"Verified without Check, holding": Verified{Source: LeaseSource{Client: c, Namespace: "ns", Pod: "w-0", UID: "me", Lease: "report"}},
		"Verified without Source":         &Verified{Check: StatusHeld{Client: c, Namespace: "ns", PodUID: "me"}},
		"EtcdHeld without Namespace": Verified{Source: LeaseSource{Client: c, Namespace: "ns", Pod: "w-0", UID: "me", Lease: "report"},
			Check: EtcdHeld{Client: &clientv3.Client{}}},
		"StatusHeld without Namespace": Verified{Source: LeaseSource{Client: c, Namespace: "ns", Pod: "w-0", UID: "me", Lease: "report"},
			Check: StatusHeld{Client: c, PodUID: "me"}},
		"a Verified wrapping a misconfigured Verified": Verified{Check: StatusHeld{Client: c, Namespace: "ns", PodUID: "me"},
			Source: Verified{Source: LeaseSource{Client: c, Namespace: "ns", Pod: "w-0", UID: "me", Lease: "report"}, Check: StatusHeld{Client: c, Namespace: "ns"}}},
		"PodSource without Client":   PodSource{Namespace: "ns", Pod: "w-0", UID: "me", Lease: "report"},
		"LeaseSource without Client": LeaseSource{Namespace: "ns", Pod: "w-0", UID: "me", Lease: "report"},
		"StatusHeld without Client, holding": &Verified{Source: LeaseSource{Client: c, Namespace: "ns", Pod: "w-0", UID: "me", Lease: "report"},
			Check: StatusHeld{Namespace: "ns", PodUID: "me"}},
		// A pod that does not hold the lease yet: the source reads no
		// token, so the check's own misconfiguration shows only up front.
		"EtcdHeld without a client, not holding": Verified{Source: LeaseSource{Client: c, Namespace: "ns", Pod: "w-1", UID: "other", Lease: "report"},
			Check: EtcdHeld{Namespace: "ns"}},
		"StatusHeld without PodUID, not holding": &Verified{Source: LeaseSource{Client: c, Namespace: "ns", Pod: "w-1", UID: "other", Lease: "report"},
			Check: StatusHeld{Client: c, Namespace: "ns"}},
	} {
		// Each of these waited for ever before: no retry fixes them.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		err := RunExclusive(ctx, src, "report", time.Millisecond, func(context.Context, Token) error {
			t.Errorf("%s: ran", name)
			return nil
		})
		if !errors.Is(err, ErrMisconfigured) {
			t.Errorf("%s: RunExclusive = %v, want ErrMisconfigured", name, err)
		}
	}
}

// A token annotation copied onto another pod (whose kubelet then stops, so
// the controller's removal never reaches its file) names a live grant, but
// not this pod's: with PodUID set, EtcdHeld does not confirm it.
func TestEtcdHeldWithPodUIDConfirmsOnlyThisPodsGrant(t *testing.T) {
	cli := connect(t, startEtcd(t))
	ctx := context.Background()
	l, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	tok := Token{Lease: "report", Value: putGrant(t, cli, "ns", "report", `{"holder":"b","holderUID":"uid-b"}`, l.ID)}
	if err := (EtcdHeld{Client: cli, Prefix: prefix, Namespace: "ns", PodUID: "uid-b"}).Held(ctx, tok); err != nil {
		t.Fatalf("the holder itself: %v", err)
	}
	copied := Verified{Source: staticSource{tok}, Check: EtcdHeld{Client: cli, Prefix: prefix, Namespace: "ns", PodUID: "uid-c"}}
	if got, err := copied.Token(ctx); !errors.Is(err, ErrNotHolder) {
		t.Fatalf("another pod's copy of the token: %+v, %v; want ErrNotHolder", got, err)
	}
}

// staticSource always reads the same token, as a Downward API file that no
// longer changes does.
type staticSource struct{ t Token }

func (s staticSource) Token(context.Context) (Token, error) { return s.t, nil }

// A poll interval that is not positive polls every second, not in a busy
// loop against the file or the apiserver.
func TestWatchWithoutAnIntervalDoesNotSpin(t *testing.T) {
	src := &countingSource{}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	for range Watch(ctx, src, "report", 0) {
	}
	if n := src.n.Load(); n > 2 {
		t.Fatalf("%d reads in 200 ms with interval 0", n)
	}
}

type countingSource struct{ n atomic.Int32 }

func (c *countingSource) Token(context.Context) (Token, error) {
	c.n.Add(1)
	return Token{Lease: "report", Value: 1}, nil
}

// A pod cut off from etcd by a path that drops its packets (connections
// stay open, nothing answers), whose Downward API file no longer changes
// (a kubelet stopped): EtcdHeld counts a grant no read has confirmed for
// a whole TTL as lost, since etcd may have expired it and granted it to
// another pod. Its watch and reads alone waited for ever, and the work
// went on under the old token. The TTL is the grant's, learnt from the
// check's first read: etcd falls silent only after it, and the loss must
// come well before the 15 s taken while no read has answered.
func TestEtcdHeldCountsAGrantUnconfirmedForItsTTLAsLost(t *testing.T) {
	endpoint := startEtcd(t)
	admin := connect(t, endpoint)
	p := newProxy(t, strings.TrimPrefix(endpoint, "http://"))
	t.Cleanup(p.flow)
	var reads atomic.Int64 // the pod's etcd reads that answered
	pod, err := clientv3.New(clientv3.Config{Endpoints: []string{p.URL()}, DialTimeout: 2 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			err := invoker(ctx, method, req, reply, cc, opts...)
			if err == nil && (strings.HasSuffix(method, "/Range") || strings.HasSuffix(method, "/Txn")) {
				reads.Add(1)
			}
			return err
		})}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pod.Close() })
	ctx := context.Background()
	// The grant says 2 s; its etcd lease lasts longer, so that only the
	// silence, not an expiry the watch could see, ends the work.
	l, err := admin.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	tok := Token{Lease: "report", Value: putGrant(t, admin, "ns", "report", `{"holder":"a","holderUID":"uid-a","ttlSeconds":2}`, l.ID)}
	src := Verified{Source: staticSource{tok}, Check: EtcdHeld{Client: pod, Prefix: prefix, Namespace: "ns", PodUID: "uid-a"}}
	running := make(chan context.Context, 1)
	done := make(chan error, 1)
	go func() {
		done <- RunExclusive(ctx, src, "report", 100*time.Millisecond, func(ctx context.Context, _ Token) error {
			running <- ctx
			<-ctx.Done()
			return ctx.Err()
		})
	}()
	var work context.Context
	select {
	case work = <-running:
	case <-time.After(30 * time.Second):
		t.Fatal("the work never started under a live grant")
	}
	waitForARead(t, &reads)
	p.stall()
	select {
	case err := <-done:
		if !errors.Is(err, ErrLeaseLost) || !errors.Is(err, ErrEtcdUnavailable) {
			t.Fatalf("RunExclusive cut off from etcd: %v, want ErrLeaseLost and ErrEtcdUnavailable", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the work went on 10 s after etcd fell silent, with a 2 s grant")
	}
	if cause := context.Cause(work); !errors.Is(cause, ErrLeaseLost) {
		t.Fatalf("the work's context ended with %v, want ErrLeaseLost", cause)
	}
}

// waitForARead waits until reads has grown: the check started with the
// work has read once, and so learnt the grant's TTL.
func waitForARead(t *testing.T, reads *atomic.Int64) {
	t.Helper()
	from := reads.Load()
	for deadline := time.Now().Add(10 * time.Second); reads.Load() == from; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("setup: the check made no read in 10 s")
		}
	}
}

// silentAPI is a client.Reader whose Gets fail while off is set, as an
// apiserver the pod cannot reach.
type silentAPI struct {
	client.Reader
	off atomic.Bool
	// reads counts the Gets that answered; past allow (if set), every
	// Get fails, as with off.
	reads, allow atomic.Int64
}

func (u *silentAPI) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if u.off.Load() || (u.allow.Load() > 0 && u.reads.Load() >= u.allow.Load()) {
		return errors.New("dial tcp 10.96.0.1:443: connect: connection refused")
	}
	err := u.Reader.Get(ctx, key, obj, opts...)
	if err == nil {
		u.reads.Add(1)
	}
	return err
}

// The same with the status check: a pod that cannot reach the apiserver
// counts a grant no read has confirmed for the grant's TTL as lost. The
// TTL is the grant's, as the status shows it (expireTime less renewTime),
// not spec.ttlSeconds, which an edit (here from 1 s to 60 s) applies only
// to the next grant. The apiserver falls silent once the check has read
// the status, and the loss must come well before the 15 s taken while no
// read has answered.
func TestStatusHeldCountsAGrantUnconfirmedForItsTTLAsLost(t *testing.T) {
	c := &silentAPI{Reader: fakeClient(grantOfOneSecond(60))}
	src := Verified{Source: staticSource{Token{Lease: "report", Value: 9}}, Check: StatusHeld{Client: c, Namespace: "ns", PodUID: "me", Interval: 10 * time.Millisecond}}
	started, done := runUntilLost(src)
	<-started
	waitForARead(t, &c.reads)
	c.off.Store(true)
	select {
	case err := <-done:
		if !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("RunExclusive with the apiserver unreachable: %v, want ErrLeaseLost", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the work went on 10 s after the apiserver fell silent, with a grant of 1 s")
	}
}

// grantOfOneSecond is a Lease held by pod uid "me" under token 9, whose
// status shows a grant of 1 s, and whose spec says ttlSeconds (0: unset).
func grantOfOneSecond(ttlSeconds int32) *fencerv1alpha1.Lease {
	l := statusLease("w-0", "me", 9)
	l.Spec.TTLSeconds = ttlSeconds
	renewed := time.Now()
	l.Status.RenewTime, l.Status.ExpireTime = &metav1.MicroTime{Time: renewed}, &metav1.MicroTime{Time: renewed.Add(time.Second)}
	return l
}

// runUntilLost runs work under src until its context ends: started is
// closed when the work begins, and done gets RunExclusive's error.
func runUntilLost(src Source) (started chan struct{}, done chan error) {
	started, done = make(chan struct{}), make(chan error, 1)
	go func() {
		done <- RunExclusive(context.Background(), src, "report", time.Hour, func(ctx context.Context, _ Token) error {
			close(started)
			<-ctx.Done()
			return ctx.Err()
		})
	}()
	return started, done
}

// A check whose reads never answer (the apiserver unreachable from just
// after the token's own confirmation) has learnt no TTL: it takes a
// Lease's default, 15 s from when it began, neither less (a false loss)
// nor for ever.
func TestStatusHeldWithNoReadAnsweredTakesTheDefaultTTL(t *testing.T) {
	c := &silentAPI{Reader: fakeClient(grantOfOneSecond(0))}
	// RunExclusive's first look at the source and Watch's first token,
	// each confirmed by a read, then nothing answers.
	c.allow.Store(2)
	src := Verified{Source: staticSource{Token{Lease: "report", Value: 9}}, Check: StatusHeld{Client: c, Namespace: "ns", PodUID: "me", Interval: 10 * time.Millisecond}}
	began := time.Now()
	started, done := runUntilLost(src)
	select {
	case <-started:
	case err := <-done:
		t.Fatalf("setup: the work never started: %v", err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("RunExclusive with no read answered: %v, want ErrLeaseLost", err)
		}
		if took := time.Since(began); took < 14*time.Second {
			t.Fatalf("the grant counted as lost %s after the check began, before a Lease's default TTL of 15 s", took)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the work went on 30 s with no read answered")
	}
	if n := c.reads.Load(); n != 2 {
		t.Fatalf("setup: %d reads answered, want only the token's two confirmations before the work", n)
	}
}
