package lease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/internal/etcdstore"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
	"github.com/fencer-io/fencer/pkg/fence"
)

// Tests run one after another: they share the fencer etcd, which one of them
// stops, and each starts its own controller.

func TestGrantPublishesCreateRevisionAsToken(t *testing.T) {
	startController(t, "c1")
	ns := namespace(t)
	readyPod(t, ns, "w-0", "w")
	readyPod(t, ns, "w-1", "w")
	create(t, newLease(ns, "job", "w", 15))

	st := heldBy(t, ns, "job")
	if st.Holder != "w-0" {
		t.Fatalf("holder %s, want w-0 (oldest Ready, then by name)", st.Holder)
	}
	if tok := etcdToken(t, ns, "job"); tok == 0 || tok != st.Token {
		t.Fatalf("status token %d, etcd CreateRevision %d: must be equal", st.Token, tok)
	}
	if st.LeaseID == 0 || st.AcquireTime == nil || st.ExpireTime == nil || st.ObservedGeneration != 1 {
		t.Fatalf("status incomplete: %+v", st)
	}
	eventually(t, 30*time.Second, "holder annotation", func() error {
		if got := annotation(t, ns, "w-0", "job"); got != itoa(st.Token) {
			return fmt.Errorf("w-0 annotation %q, want %d", got, st.Token)
		}
		return nil
	})
	if got := annotation(t, ns, "w-1", "job"); got != "" {
		t.Fatalf("non-holder w-1 carries the token annotation %q", got)
	}
	// The finalizer (no Lease deletion webhook runs here), and the grant
	// records which Lease object it is for.
	l := getLease(t, ns, "job")
	if len(l.Finalizers) != 1 || l.Finalizers[0] != "fencer.io/release" {
		t.Fatalf("finalizers %v", l.Finalizers)
	}
	g, err := etcdstore.NewStore(fx.EtcdCli, prefix, nil, nil).GetGrant(context.Background(), ns, "job")
	if err != nil || g == nil || g.LeaseUID != string(l.UID) {
		t.Fatalf("the grant in etcd: %+v (%v), want one recording Lease UID %s", g, err, l.UID)
	}
}

func TestFailoverWhenHolderGoesNotReady(t *testing.T) {
	startController(t, "c1")
	ns := namespace(t)
	p0 := readyPod(t, ns, "w-0", "w")
	readyPod(t, ns, "w-1", "w")
	create(t, newLease(ns, "job", "w", 2))
	first := heldBy(t, ns, "job")

	setReady(t, p0, false)
	second := heldBy(t, ns, "job", first.Holder)
	if second.Holder != "w-1" || second.Token <= first.Token {
		t.Fatalf("after failover: holder %s token %d; want w-1 with a token above %d", second.Holder, second.Token, first.Token)
	}
	if tok := etcdToken(t, ns, "job"); tok != second.Token {
		t.Fatalf("etcd CreateRevision %d, status token %d", tok, second.Token)
	}
	eventually(t, 30*time.Second, "annotation moved", func() error {
		if a, b := annotation(t, ns, "w-0", "job"), annotation(t, ns, "w-1", "job"); a != "" || b != itoa(second.Token) {
			return fmt.Errorf("w-0 %q, w-1 %q", a, b)
		}
		return nil
	})
	if second.Transitions != 1 || len(second.History) != 2 || second.History[1].EndReason != fencerv1.TenureHolderNotReady || second.History[1].Token != first.Token {
		t.Fatalf("history/transitions not recorded: %+v", second)
	}
}

func TestFailoverWhenHolderIsDeleted(t *testing.T) {
	startController(t, "c1")
	ns := namespace(t)
	p0 := readyPod(t, ns, "w-0", "w")
	readyPod(t, ns, "w-1", "w")
	create(t, newLease(ns, "job", "w", 2))
	first := heldBy(t, ns, "job")

	if err := k8s.Delete(context.Background(), p0, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	second := heldBy(t, ns, "job", first.Holder)
	if second.Token <= first.Token {
		t.Fatalf("token %d not above %d", second.Token, first.Token)
	}
	if second.History[1].EndReason != fencerv1.TenureHolderGone {
		t.Fatalf("end reason %q, want HolderGone", second.History[1].EndReason)
	}
}

func TestSuspend(t *testing.T) {
	startController(t, "c1")
	ns := namespace(t)
	readyPod(t, ns, "w-0", "w")
	create(t, newLease(ns, "job", "w", 15))
	first := heldBy(t, ns, "job")

	patchSuspend(t, ns, "job", true)
	eventually(t, 30*time.Second, "suspended", func() error {
		l := getLease(t, ns, "job")
		if heldReason(l) != fencerv1.ReasonSuspended || l.Status.Holder != "" || etcdToken(t, ns, "job") != 0 || annotation(t, ns, "w-0", "job") != "" {
			return fmt.Errorf("reason %q holder %q key %d annotation %q", heldReason(l), l.Status.Holder, etcdToken(t, ns, "job"), annotation(t, ns, "w-0", "job"))
		}
		return nil
	})

	patchSuspend(t, ns, "job", false)
	again := heldBy(t, ns, "job")
	if again.Token <= first.Token {
		t.Fatalf("token after resume %d not above %d", again.Token, first.Token)
	}
}

func patchSuspend(t *testing.T, ns, name string, suspend bool) {
	t.Helper()
	l := getLease(t, ns, name)
	patch := client.MergeFrom(l.DeepCopy())
	l.Spec.Suspend = suspend
	if err := k8s.Patch(context.Background(), l, patch); err != nil {
		t.Fatal(err)
	}
}

func TestNoCandidates(t *testing.T) {
	startController(t, "c1")
	ns := namespace(t)
	create(t, newLease(ns, "job", "nobody", 15))
	eventually(t, 30*time.Second, "NoCandidates", func() error {
		if r := heldReason(getLease(t, ns, "job")); r != fencerv1.ReasonNoCandidates {
			return fmt.Errorf("reason %q", r)
		}
		return nil
	})
	readyPod(t, ns, "late", "nobody")
	if st := heldBy(t, ns, "job"); st.Holder != "late" {
		t.Fatalf("holder %s", st.Holder)
	}
}

func TestDeletingALeaseReleasesItsKey(t *testing.T) {
	startController(t, "c1")
	ns := namespace(t)
	readyPod(t, ns, "w-0", "w")
	l := newLease(ns, "job", "w", 15)
	create(t, l)
	heldBy(t, ns, "job")
	if err := k8s.Delete(context.Background(), l); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "lease gone, key released, annotation removed", func() error {
		err := k8s.Get(context.Background(), client.ObjectKeyFromObject(l), &fencerv1.Lease{})
		if !apierrors.IsNotFound(err) || etcdToken(t, ns, "job") != 0 || annotation(t, ns, "w-0", "job") != "" {
			return fmt.Errorf("get: %w, key %d, annotation %q", err, etcdToken(t, ns, "job"), annotation(t, ns, "w-0", "job"))
		}
		return nil
	})
}

// TestRestartAdoptsGrant: a controller that replaces another mid-tenure keeps
// the grant (same token) and renews it past its TTL.
func TestRestartAdoptsGrant(t *testing.T) {
	stop := startController(t, "c1")
	ns := namespace(t)
	readyPod(t, ns, "w-0", "w")
	create(t, newLease(ns, "job", "w", 6))
	first := heldBy(t, ns, "job")
	stop()

	startController(t, "c2")
	// Two TTLs: the key outlives them only if the new controller renews it.
	time.Sleep(13 * time.Second)
	if tok := etcdToken(t, ns, "job"); tok != first.Token {
		t.Fatalf("etcd token after restart %d, want the adopted %d", tok, first.Token)
	}
	if st := heldBy(t, ns, "job"); st.Token != first.Token || st.Transitions != 0 {
		t.Fatalf("status after restart: token %d transitions %d, want %d and 0", st.Token, st.Transitions, first.Token)
	}
}

// TestEtcdUnavailable: with etcd down the Lease says EtcdUnavailable, and it
// is held again once etcd is back.
func TestEtcdUnavailable(t *testing.T) {
	startController(t, "c1")
	ns := namespace(t)
	readyPod(t, ns, "w-0", "w")
	create(t, newLease(ns, "job", "w", 15))
	heldBy(t, ns, "job")

	if err := etcd.Stop(); err != nil {
		t.Fatal(err)
	}
	restarted := false
	defer func() {
		if !restarted {
			_ = etcd.Start(context.Background())
		}
	}()
	// Any change to the Lease makes the controller look at etcd at once.
	touch(t, ns, "job")
	eventually(t, 60*time.Second, "EtcdUnavailable", func() error {
		if r := heldReason(getLease(t, ns, "job")); r != fencerv1.ReasonEtcdUnavailable {
			return fmt.Errorf("reason %q", r)
		}
		return nil
	})

	if err := etcd.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	restarted = true
	eventually(t, 60*time.Second, "held again", func() error {
		l := getLease(t, ns, "job")
		if heldReason(l) != fencerv1.ReasonGranted || l.Status.Token != etcdToken(t, ns, "job") {
			return fmt.Errorf("reason %q token %d etcd %d", heldReason(l), l.Status.Token, etcdToken(t, ns, "job"))
		}
		return nil
	})
}

func touch(t *testing.T, ns, name string) {
	t.Helper()
	l := getLease(t, ns, name)
	patch := client.MergeFrom(l.DeepCopy())
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	l.Annotations["test/touched"] = time.Now().String()
	if err := k8s.Patch(context.Background(), l, patch); err != nil {
		t.Fatal(err)
	}
}

// TestManyLeases: 200 Leases at once are all granted, and every status
// agrees with etcd and with the holder's annotations.
func TestManyLeases(t *testing.T) {
	startController(t, "c1")
	ns := namespace(t)
	readyPod(t, ns, "w-0", "many")
	readyPod(t, ns, "w-1", "many")
	const n = 200
	for i := range n {
		create(t, newLease(ns, fmt.Sprintf("l-%03d", i), "many", 30))
	}
	eventually(t, 120*time.Second, "all 200 held", func() error {
		var list fencerv1.LeaseList
		if err := k8s.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
			return err
		}
		held := 0
		for _, l := range list.Items {
			if heldReason(&l) == fencerv1.ReasonGranted && l.Status.Token != 0 {
				held++
			}
		}
		if held != n {
			return fmt.Errorf("%d of %d held", held, n)
		}
		return nil
	})
	var list fencerv1.LeaseList
	if err := k8s.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	seen := map[int64]string{}
	pod := &corev1.Pod{}
	if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "w-0"}, pod); err != nil {
		t.Fatal(err)
	}
	for _, l := range list.Items {
		if tok := etcdToken(t, ns, l.Name); tok != l.Status.Token {
			t.Errorf("%s: status token %d, etcd %d", l.Name, l.Status.Token, tok)
		}
		if prev, dup := seen[l.Status.Token]; dup {
			t.Errorf("%s and %s share token %d", prev, l.Name, l.Status.Token)
		}
		seen[l.Status.Token] = l.Name
		if l.Status.Holder != "w-0" {
			t.Errorf("%s held by %s, want w-0", l.Name, l.Status.Holder)
		}
	}
	eventually(t, 60*time.Second, "all annotations on w-0", func() error {
		if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "w-0"}, pod); err != nil {
			return err
		}
		for _, l := range list.Items {
			if got := pod.Annotations["lease.fencer.io/"+l.Name]; got != itoa(l.Status.Token) {
				return fmt.Errorf("%s: annotation %q, token %d", l.Name, got, l.Status.Token)
			}
		}
		return nil
	})
}

// TestDirectRenewalExpiresWithoutTheHolder: with renewal Direct the
// controller publishes the etcd lease ID and does not renew; when nobody
// renews, etcd expires the key, the watch wakes the controller, and the next
// grant carries a larger token.
func TestDirectRenewalExpiresWithoutTheHolder(t *testing.T) {
	startController(t, "c1")
	ns := namespace(t)
	readyPod(t, ns, "w-0", "w")
	createDirect(t, ns, 2)
	first := heldBy(t, ns, "job")
	eventually(t, 30*time.Second, "lease ID annotation", func() error {
		p := &corev1.Pod{}
		if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "w-0"}, p); err != nil {
			return err
		}
		if got := p.Annotations["leaseid.fencer.io/job"]; got != itoa(first.LeaseID) {
			return fmt.Errorf("leaseid annotation %q, want %d", got, first.LeaseID)
		}
		return nil
	})
	eventually(t, 60*time.Second, "expired and granted again", func() error {
		st := getLease(t, ns, "job").Status
		if st.Token <= first.Token || len(st.History) < 2 {
			return fmt.Errorf("token %d, history %d", st.Token, len(st.History))
		}
		if st.History[1].EndReason != fencerv1.TenureExpired {
			return fmt.Errorf("previous tenure ended %q, want Expired", st.History[1].EndReason)
		}
		return nil
	})
}

// TestExpiredDirectHolderIsPassedOver: a Direct holder that never renews
// (its process frozen, its pod still Ready) is not granted again while
// another candidate is Ready.
func TestExpiredDirectHolderIsPassedOver(t *testing.T) {
	startController(t, "c1")
	ns := namespace(t)
	readyPod(t, ns, "w-0", "w")
	createDirect(t, ns, 2)
	heldBy(t, ns, "job")
	readyPod(t, ns, "w-1", "w")
	eventually(t, 60*time.Second, "the expired grant passed to w-1", func() error {
		st := getLease(t, ns, "job").Status
		if st.Holder != "w-1" {
			return fmt.Errorf("holder %q, history %d", st.Holder, len(st.History))
		}
		if st.History[1].Holder != "w-0" || st.History[1].EndReason != fencerv1.TenureExpired {
			return fmt.Errorf("previous tenure %+v, want w-0 Expired", st.History[1])
		}
		return nil
	})
}

// TestEventsAreRecorded: grants and tenure ends show up as Events on the Lease.
func TestEventsAreRecorded(t *testing.T) {
	startController(t, "c1")
	ns := namespace(t)
	p0 := readyPod(t, ns, "w-0", "w")
	readyPod(t, ns, "w-1", "w")
	create(t, newLease(ns, "job", "w", 2))
	heldBy(t, ns, "job")
	setReady(t, p0, false)
	heldBy(t, ns, "job", "w-0")
	eventually(t, 30*time.Second, "Granted and Released events", func() error {
		reasons, err := eventReasons(ns, "job")
		if err != nil {
			return err
		}
		// The end is "Released" when the controller's conditional delete runs
		// first, "Expired" when etcd's lessor beats it; both are events.
		if reasons["Granted"] < 2 || reasons["Released"]+reasons["Expired"] < 1 {
			return fmt.Errorf("events by reason: %v", reasons)
		}
		return nil
	})
}

// TestDirectHolderRenewsWithHold: with renewal Direct, the SDK's Hold keeps
// the controller's grant alive past its TTL (same token); when the holder
// stops renewing, the controller grants again with a larger token.
func TestDirectHolderRenewsWithHold(t *testing.T) {
	startController(t, "c1")
	ns := namespace(t)
	w0 := readyPod(t, ns, "w-0", "w")
	createDirect(t, ns, 2)
	heldBy(t, ns, "job")
	src := fence.LeaseSource{Client: k8s, Namespace: ns, Lease: "job", Pod: "w-0", UID: w0.UID}
	tok, err := src.Token(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	cli, err := fx.ConnectEtcd()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, stopRenewing := context.WithCancel(context.Background())
	held, err := fence.Hold(ctx, cli, prefix, ns, tok)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Second) // 2.5 TTLs: the grant lives only if Hold renews it
	if held.Err() != nil || etcdToken(t, ns, "job") != tok.Value {
		t.Fatalf("Hold did not keep the grant: ctx %v, etcd token %d, want %d", context.Cause(held), etcdToken(t, ns, "job"), tok.Value)
	}
	stopRenewing()
	eventually(t, 30*time.Second, "granted again after the holder stopped renewing", func() error {
		if st := getLease(t, ns, "job").Status; st.Token <= tok.Value {
			return fmt.Errorf("token %d", st.Token)
		}
		return nil
	})
}

// TestDirectHolderReleases: a Direct holder that finishes early gives the
// lease back with fence.Release, and the next candidate is granted long
// before the TTL (60 s) would have run out; the tenure ends as Released.
// The first holder's release, repeated with its old token, ends nothing.
func TestDirectHolderReleases(t *testing.T) {
	startController(t, "c1")
	ns := namespace(t)
	readyPod(t, ns, "w-0", "w")
	createDirect(t, ns, 60)
	st := heldBy(t, ns, "job")
	first := st.Holder
	readyPod(t, ns, "w-1", "w")
	tok, err := fence.LeaseSource{Client: k8s, Namespace: ns, Lease: "job", Pod: first, UID: st.HolderUID}.Token(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	cli, err := fx.ConnectEtcd()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, stopRenewing := context.WithCancel(context.Background())
	if _, err := fence.Hold(ctx, cli, prefix, ns, tok); err != nil {
		t.Fatal(err)
	}
	stopRenewing()
	if err := fence.Release(context.Background(), cli, prefix, ns, tok); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "w-1 granted well within the 60 s TTL", func() error {
		// w-0 is older, but it gave the lease back: it is passed over.
		if st := getLease(t, ns, "job").Status; st.Token <= tok.Value || st.Holder != "w-1" {
			return fmt.Errorf("holder %q token %d", st.Holder, st.Token)
		}
		return nil
	})
	st = getLease(t, ns, "job").Status
	if ended := st.History[1]; ended.Token != tok.Value || ended.EndReason != fencerv1.TenureReleased {
		t.Fatalf("the released tenure: %+v, want token %d ended Released", ended, tok.Value)
	}
	var fenced *fence.FencedError
	if err := fence.Release(context.Background(), cli, prefix, ns, tok); !errors.As(err, &fenced) {
		t.Fatalf("the old token's second Release: %v, want a FencedError", err)
	}
	if got := etcdToken(t, ns, "job"); got != st.Token {
		t.Fatalf("etcd token %d after a stale Release, want %d", got, st.Token)
	}
	wantEvent(t, ns, "job", fencerv1.ReasonReleased)
}

// TestRevisionRegressionRefusesGrants: when etcd comes back with a revision
// below a token the Lease already issued (an empty etcd here; a restore
// without --bump-revision is the same), granting would hand out old tokens
// again. The controller refuses, says why, and grants again once etcd's
// revision has passed the old token.
func TestRevisionRegressionRefusesGrants(t *testing.T) {
	ctx := context.Background()
	ns, _, old := grantThenWipeEtcd(t)
	touch(t, ns, "job")
	eventually(t, 60*time.Second, "EtcdRevisionRegressed", func() error {
		l := getLease(t, ns, "job")
		if r := heldReason(l); r != fencerv1.ReasonEtcdRevisionRegressed {
			return fmt.Errorf("reason %q, token %d", r, l.Status.Token)
		}
		return nil
	})
	if tok := etcdToken(t, ns, "job"); tok != 0 {
		t.Fatalf("granted token %d from a regressed etcd (highest issued %d)", tok, old)
	}
	wantEvent(t, ns, "job", fencerv1.ReasonEtcdRevisionRegressed)

	// The operator's fix: move the revision past every issued token.
	for i := 0; ; i++ {
		resp, err := fx.EtcdCli.Put(ctx, "/test/bump", strconv.Itoa(i))
		if err != nil {
			t.Fatal(err)
		}
		if resp.Header.Revision > old {
			break
		}
	}
	touch(t, ns, "job")
	eventually(t, 60*time.Second, "held again above the old token", func() error {
		l := getLease(t, ns, "job")
		if heldReason(l) != fencerv1.ReasonGranted || l.Status.Token <= old {
			return fmt.Errorf("reason %q token %d, old %d", heldReason(l), l.Status.Token, old)
		}
		return nil
	})
}

// TestNoGrantBelowTheLockFloor: while the manager's lock floor key exists
// (it found etcd's revision below one it had recorded outside etcd: a
// restore without --bump-revision, a new cluster), no Lease is granted,
// not even one created since, whose status remembers no token to compare
// with (a WorkloadLease re-creates its members that way): every token
// issued now may have been issued before. Once the floor goes, it is.
func TestNoGrantBelowTheLockFloor(t *testing.T) {
	ctx := context.Background()
	startController(t, "c1")
	ns := namespace(t)
	floor := etcdkeys.LockFloorKey(prefix)
	if _, err := fx.EtcdCli.Put(ctx, floor, "999999999"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = fx.EtcdCli.Delete(context.Background(), floor) })
	readyPod(t, ns, "w-0", "w")
	create(t, newLease(ns, "job", "w", 5))
	eventually(t, 60*time.Second, "EtcdRevisionRegressed", func() error {
		if r := heldReason(getLease(t, ns, "job")); r != fencerv1.ReasonEtcdRevisionRegressed {
			return fmt.Errorf("reason %q", r)
		}
		return nil
	})
	if tok := etcdToken(t, ns, "job"); tok != 0 {
		t.Fatalf("granted token %d below the lock floor", tok)
	}
	wantEvent(t, ns, "job", fencerv1.ReasonEtcdRevisionRegressed)
	if _, err := fx.EtcdCli.Delete(ctx, floor); err != nil {
		t.Fatal(err)
	}
	heldBy(t, ns, "job")
}

// createDirect creates Lease ns/job over the pods labeled app=w, renewed
// by its holder (renewal: Direct).
func createDirect(t *testing.T, ns string, ttl int32) {
	t.Helper()
	l := newLease(ns, "job", "w", ttl)
	l.Spec.Renewal = fencerv1.RenewalDirect
	create(t, l)
}

// wantEvent waits until Lease ns/name has an Event with reason.
func wantEvent(t *testing.T, ns, name, reason string) {
	t.Helper()
	eventually(t, 30*time.Second, "a "+reason+" Event", func() error {
		reasons, err := eventReasons(ns, name)
		if err == nil && reasons[reason] == 0 {
			err = fmt.Errorf("events by reason: %v", reasons)
		}
		return err
	})
}

// eventReasons counts the Events about Lease ns/name by reason.
func eventReasons(ns, name string) (map[string]int, error) {
	var list eventsv1.EventList
	if err := k8s.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		return nil, err
	}
	reasons := map[string]int{}
	for _, e := range list.Items {
		if e.Regarding.Kind == "Lease" && e.Regarding.Name == name {
			reasons[e.Reason]++
		}
	}
	return reasons, nil
}

// grantThenWipeEtcd pushes etcd's revision up, has Lease ns/job granted to
// pod w-0, then replaces fencer's etcd with an empty one, far below the
// token issued: what a restore of an old snapshot does to revisions.
func grantThenWipeEtcd(t *testing.T) (ns string, pod *corev1.Pod, issued int64) {
	t.Helper()
	ctx := context.Background()
	for i := range 100 {
		if _, err := fx.EtcdCli.Put(ctx, fmt.Sprintf("/test/bump/%d", i), "x"); err != nil {
			t.Fatal(err)
		}
	}
	startController(t, "c1")
	ns = namespace(t)
	pod = readyPod(t, ns, "w-0", "w")
	create(t, newLease(ns, "job", "w", 5))
	issued = heldBy(t, ns, "job").Token
	if err := etcd.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := etcd.Wipe(); err != nil {
		t.Fatal(err)
	}
	if err := etcd.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return ns, pod, issued
}

// TestRestoredGrantBelowIssuedTokenIsRefused: an etcd restored from an old
// snapshot brings back a grant whose token is below one the Lease already
// issued. The controller must not adopt it (that would reissue a token): it
// refuses it with the regression condition and Event, and deletes it.
func TestRestoredGrantBelowIssuedTokenIsRefused(t *testing.T) {
	ctx := context.Background()
	ns, pod, issued := grantThenWipeEtcd(t)
	// What a restore of an early snapshot holds: the same holder's grant,
	// at a low revision.
	lease, err := fx.EtcdCli.Grant(ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	value, _ := json.Marshal(etcdstore.GrantValue{Holder: pod.Name, HolderUID: string(pod.UID), LeaseID: int64(lease.ID), GrantTime: time.Now(), TTL: 30})
	// With its grant marker, written in the same transaction, as the
	// controller made it before the snapshot.
	put, err := fx.EtcdCli.Txn(ctx).Then(
		clientv3.OpPut(etcdkeys.LeaseKey(prefix, ns, "job"), string(value), clientv3.WithLease(lease.ID)),
		clientv3.OpPut(etcdkeys.GrantMarkerKey(prefix, ns, "job"), "")).Commit()
	if err != nil {
		t.Fatal(err)
	}
	if put.Header.Revision >= issued {
		t.Fatalf("the restored grant's token %d is not below the issued %d", put.Header.Revision, issued)
	}
	touch(t, ns, "job")
	eventually(t, 60*time.Second, "the restored grant refused and deleted", func() error {
		l := getLease(t, ns, "job")
		if r := heldReason(l); r != fencerv1.ReasonEtcdRevisionRegressed {
			return fmt.Errorf("reason %q, token %d", r, l.Status.Token)
		}
		if tok := etcdToken(t, ns, "job"); tok != 0 {
			return fmt.Errorf("the restored grant (token %d) is still in etcd", tok)
		}
		return nil
	})
	if l := getLease(t, ns, "job"); l.Status.Token != 0 && l.Status.Token < issued {
		t.Fatalf("status adopted the restored token %d below the issued %d", l.Status.Token, issued)
	}
	if ann := annotation(t, ns, pod.Name, "job"); ann != "" && ann != strconv.FormatInt(issued, 10) {
		t.Fatalf("the holder pod was given the restored token %s", ann)
	}
}

// TestSwitchingToDirectStopsControllerRenewals: after renewal changes from
// PodReady to Direct the holder must renew itself; the controller stops, so
// a holder that does not renew loses the grant within its TTL.
func TestSwitchingToDirectStopsControllerRenewals(t *testing.T) {
	startController(t, "c1")
	ns := namespace(t)
	readyPod(t, ns, "w-0", "w")
	create(t, newLease(ns, "job", "w", 2))
	tok := heldBy(t, ns, "job").Token
	l := getLease(t, ns, "job")
	patch := client.MergeFrom(l.DeepCopy())
	l.Spec.Renewal = fencerv1.RenewalDirect
	if err := k8s.Patch(context.Background(), l, patch); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the PodReady grant expired once nobody renewed it", func() error {
		if got := etcdToken(t, ns, "job"); got == tok {
			return fmt.Errorf("token %d still live: the controller keeps renewing a Direct lease", tok)
		}
		return nil
	})
}

// TestCompactionDuringARun compacts etcd to its current revision while a
// Lease is held, hands it over, and compacts again: no token changes but by
// a grant, and the controller keeps granting (its lease watch starts at the
// current revision, so a compaction never cancels it).
func TestCompactionDuringARun(t *testing.T) {
	startController(t, "c1")
	ns := namespace(t)
	p0 := readyPod(t, ns, "w-0", "w")
	readyPod(t, ns, "w-1", "w")
	create(t, newLease(ns, "job", "w", 3))
	first := heldBy(t, ns, "job")
	compactNow := func() {
		t.Helper()
		resp, err := fx.EtcdCli.Get(context.Background(), "compaction-probe")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := fx.EtcdCli.Compact(context.Background(), resp.Header.Revision); err != nil {
			t.Fatal(err)
		}
	}
	compactNow()
	time.Sleep(time.Second) // a renewal round after the compaction
	if tok := etcdToken(t, ns, "job"); tok != first.Token {
		t.Fatalf("compaction changed the grant's token: %d, want %d", tok, first.Token)
	}
	setReady(t, p0, false)
	second := heldBy(t, ns, "job", first.Holder)
	if second.Token <= first.Token {
		t.Fatalf("after compaction and handover: token %d, want above %d", second.Token, first.Token)
	}
	compactNow()
	time.Sleep(time.Second)
	if tok, st := etcdToken(t, ns, "job"), getLease(t, ns, "job").Status; tok != second.Token || st.Token != second.Token || st.Holder != second.Holder {
		t.Fatalf("after the second compaction: etcd %d, status %d held by %s; want %d held by %s", tok, st.Token, st.Holder, second.Token, second.Holder)
	}
}

// TestRecreatedLeaseKeyIsNeverAdopted: a Direct Lease's namespace identity
// may write the Lease's key (etcd requires it to renew), so a hostile pod
// can delete the key and put it back, minting a new CreateRevision. The
// controller must not adopt that token: it deletes the key (Warning
// UnissuedGrant) and grants anew, with a token above the minted one.
func TestRecreatedLeaseKeyIsNeverAdopted(t *testing.T) {
	startController(t, "c1")
	ctx := context.Background()
	ns := namespace(t)
	readyPod(t, ns, "w-0", "w")
	createDirect(t, ns, 30)
	first := heldBy(t, ns, "job")
	key := etcdkeys.LeaseKey(prefix, ns, "job")
	// The forger keeps the value and even the etcd lease: only the
	// CreateRevision changes. The controller may see the key gone and
	// revoke that lease before the forger puts the key back (see the
	// Events below); then the put is refused, and the forger tries again
	// on the next grant.
	var minted int64
	eventually(t, 30*time.Second, "a forged key put back on the grant's etcd lease", func() error {
		resp, err := fx.EtcdCli.Get(ctx, key)
		if err != nil {
			return err
		}
		if len(resp.Kvs) != 1 {
			return fmt.Errorf("no grant yet: %v", resp)
		}
		kv := resp.Kvs[0]
		if _, err := fx.EtcdCli.Delete(ctx, key); err != nil {
			return err
		}
		forged, err := fx.EtcdCli.Put(ctx, key, string(kv.Value), clientv3.WithLease(clientv3.LeaseID(kv.Lease)))
		if err != nil {
			return err
		}
		minted = forged.Header.Revision
		return nil
	})
	touch(t, ns, "job")
	eventually(t, 30*time.Second, "the re-created key replaced by a real grant", func() error {
		st := getLease(t, ns, "job").Status
		tok := etcdToken(t, ns, "job")
		if st.Token == minted || tok == minted {
			return fmt.Errorf("the minted token %d is live (status %d, etcd %d)", minted, st.Token, tok)
		}
		if st.Token <= minted || tok != st.Token {
			return fmt.Errorf("status token %d, etcd %d; want a new grant above %d", st.Token, tok, minted)
		}
		return nil
	})
	// Which Warning explains it depends on what the controller saw first.
	// If it saw the forged key, it deleted it: UnissuedGrant. If it saw the
	// key gone before the forger put it back, the holder's etcd lease was
	// still alive, so it took the tenure as released by the holder and
	// revoked that lease, which took the forged key with it: Released. In
	// both, the minted token was never adopted (above) and the next grant is
	// above it.
	eventually(t, 30*time.Second, "an UnissuedGrant or Released Event", func() error {
		reasons, err := eventReasons(ns, "job")
		if err == nil && reasons[fencerv1.ReasonUnissuedGrant] == 0 && reasons[fencerv1.ReasonReleased] == 0 {
			err = fmt.Errorf("events by reason: %v", reasons)
		}
		return err
	})
	if first.Token >= minted {
		t.Fatalf("setup: first token %d, minted %d", first.Token, minted)
	}
}

// TestRewrittenLeaseKeyIsNeverAdopted: the same namespace identity can
// also Put the key in place, keeping its CreateRevision (the token) and
// the marker's match, to name itself the holder or detach the key from
// its etcd lease so that it never expires. A rewritten key is no grant:
// the controller deletes it and grants anew, and nothing ever publishes
// the forged holder.
func TestRewrittenLeaseKeyIsNeverAdopted(t *testing.T) {
	startController(t, "c1")
	ctx := context.Background()
	ns := namespace(t)
	readyPod(t, ns, "w-0", "w")
	createDirect(t, ns, 30)
	first := heldBy(t, ns, "job")
	key := etcdkeys.LeaseKey(prefix, ns, "job")
	forged := fmt.Sprintf(`{"holder":"intruder","holderUID":"intruder-uid","leaseID":%d}`, first.LeaseID)
	if _, err := fx.EtcdCli.Put(ctx, key, forged); err != nil { // no lease: it would never expire
		t.Fatal(err)
	}
	touch(t, ns, "job")
	eventually(t, 30*time.Second, "the rewritten key replaced by a real grant", func() error {
		st := getLease(t, ns, "job").Status
		if st.Holder == "intruder" {
			t.Fatalf("the forged holder was published: %+v", st)
		}
		if tok := etcdToken(t, ns, "job"); st.Token <= first.Token || tok != st.Token {
			return fmt.Errorf("status token %d, etcd %d; want a new grant above %d", st.Token, tok, first.Token)
		}
		return nil
	})
	wantEvent(t, ns, "job", fencerv1.ReasonUnissuedGrant)
}

// TestReadyCondition: Ready, which kubectl wait, kstatus and Argo CD read,
// is false while no pod can hold the Lease, true once one does, true when
// suspended (held by no one, as asked), and always names the generation
// it describes.
func TestReadyCondition(t *testing.T) {
	startController(t, "c1")
	ns := namespace(t)
	create(t, newLease(ns, "job", "w", 5))
	ready := func(status metav1.ConditionStatus, reason string) func() error {
		return func() error {
			l := getLease(t, ns, "job")
			c := meta.FindStatusCondition(l.Status.Conditions, fencerv1.ConditionReady)
			if c == nil || c.Status != status || c.Reason != reason || c.ObservedGeneration != l.Generation {
				return fmt.Errorf("Ready %+v at generation %d, want %s/%s", c, l.Generation, status, reason)
			}
			return nil
		}
	}
	eventually(t, 30*time.Second, "Ready False without candidates", ready(metav1.ConditionFalse, fencerv1.ReasonNoCandidates))
	readyPod(t, ns, "w-0", "w")
	eventually(t, 30*time.Second, "Ready True once held", ready(metav1.ConditionTrue, fencerv1.ReasonGranted))
	patchSuspend(t, ns, "job", true)
	eventually(t, 30*time.Second, "Ready True when suspended, at the new generation", ready(metav1.ConditionTrue, fencerv1.ReasonSuspended))
}
