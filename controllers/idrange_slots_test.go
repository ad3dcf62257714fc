package controllers

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/internal/etcdstore"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
	"github.com/fencer-io/fencer/test/support/testenv"
)

// storeWithTerm is a Store on a real etcd with TLS and auth, whose elector
// holds the term, and the manager's client to that etcd.
func storeWithTerm(t *testing.T) (*clientv3.Client, *etcdstore.Store, *etcdstore.Elector) {
	t.Helper()
	e := testenv.StartSecureEtcd(t, etcdkeys.DefaultPrefix)
	cli := e.Client(t, "manager")
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	elector := etcdstore.NewElector(cli, etcdkeys.DefaultPrefix, "test", 5*time.Second)
	go func() { _ = elector.Start(ctx) }()
	for _, err := elector.Term(); err != nil; _, err = elector.Term() {
		select {
		case <-elector.Changed():
		case <-time.After(10 * time.Second):
			t.Fatal("no etcd term")
		}
	}
	return cli, etcdstore.NewStore(cli, etcdkeys.DefaultPrefix, elector, nil), elector
}

// apiScheme knows core objects and fencer's.
func apiScheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := fencerv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	return scheme
}

// A Slots IDRange deleted with its finalizer removed by hand, and created
// again under its name with a smaller max within the slot TTL: a pod's
// live slot of the old range lies outside [min, max], and its worker ID
// may now belong to another range. It is released at once, with a
// Warning, and the pod gets a slot in the range; the status counts only
// the range's own slots. (It was renewed and annotated as before.)
func TestASlotOutsideTheRangeIsReplaced(t *testing.T) {
	cli, store, elector := storeWithTerm(t)
	ctx := context.Background()
	l, err := cli.Grant(ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	oldKey := etcdkeys.SlotKey(etcdkeys.DefaultPrefix, "ns", "ids", 900)
	if _, err := cli.Put(ctx, oldKey, `{"pod":"p","podUID":"uid-p"}`, clientv3.WithLease(l.ID)); err != nil {
		t.Fatal(err)
	}
	key := fencerv1.IDRangeAnnotationPrefix + "ids"
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "uid-p", Labels: map[string]string{"app": "x"},
		Annotations: map[string]string{key: "slot=900,token=3"}}}
	rng := &fencerv1.IDRange{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "ids", UID: "new"},
		Spec: fencerv1.IDRangeSpec{Mode: fencerv1.ModeSlots, Min: 0, Max: 15, SlotTTLSeconds: ptr.To[int32](10),
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "x"}}}}
	api := fake.NewClientBuilder().WithScheme(apiScheme(t)).WithObjects(pod, rng).Build()
	if err := api.Get(ctx, client.ObjectKeyFromObject(rng), rng); err != nil {
		t.Fatal(err) // the cache's copy, as current as the API's
	}
	r := NewIDRangeReconciler(api, store, elector, nil, clock.RealClock{})
	r.APIReader = api
	r.Renewer.Ensure(oldKey, l.ID, time.Now()) // this manager renewed it for the old range
	var out outcome
	if err := r.slots(ctx, rng, []corev1.Pod{*pod}, &out); err != nil {
		t.Fatal(err)
	}
	got := &corev1.Pod{}
	if err := api.Get(ctx, client.ObjectKeyFromObject(pod), got); err != nil {
		t.Fatal(err)
	}
	var n, token int64
	if _, err := fmt.Sscanf(got.Annotations[key], "slot=%d,token=%d", &n, &token); err != nil || n < 0 || n > 15 {
		t.Fatalf("the pod's annotation %q: want a slot in [0, 15] (%v)", got.Annotations[key], err)
	}
	if r.Renewer.Renewing(oldKey, l.ID) {
		t.Error("slot 900, outside the range, is still renewed")
	}
	if resp, err := cli.Get(ctx, oldKey); err != nil || len(resp.Kvs) != 0 {
		t.Errorf("slot 900, outside the range, is still there (%v): its generator is not fenced off", err)
	}
	if rng.Status.SlotsInUse != 1 || rng.Status.Remaining != 15 {
		t.Errorf("status: %d slots in use, %d remaining; want 1 and 15 (slot 900 is not the range's)", rng.Status.SlotsInUse, rng.Status.Remaining)
	}
	warned := 0
	for _, ev := range out.events {
		if ev.reason == "SlotOutOfRange" && strings.Contains(ev.note, "slot 900") {
			warned++
		}
	}
	if warned != 1 {
		t.Errorf("events %+v: want one SlotOutOfRange naming slot 900", out.events)
	}
	// The next pass finds the pod on its new slot, and says nothing more.
	var again outcome
	if err := r.slots(ctx, rng, []corev1.Pod{*got}, &again); err != nil {
		t.Fatal(err)
	}
	for _, ev := range again.events {
		if ev.reason == "SlotOutOfRange" {
			t.Errorf("the next pass warned again: %+v", ev)
		}
	}
}

// With a selector it cannot parse, a Slots range hands out nothing and
// keeps what pods hold: the slot of a pod still there is renewed (on a new
// leader too), one whose pod is gone is not, and one outside [min, max]
// is released at once, as in an ordinary pass. The Warning comes once per
// generation, not at every periodic pass; a Blocks range needs no pass
// until its spec changes.
func TestAnInvalidSelectorKeepsTheSlotsPodsHold(t *testing.T) {
	cli, store, elector := storeWithTerm(t)
	ctx := context.Background()
	slot := func(n int64, pod string) string {
		l, err := cli.Grant(ctx, 30)
		if err != nil {
			t.Fatal(err)
		}
		key := etcdkeys.SlotKey(etcdkeys.DefaultPrefix, "ns", "ids", n)
		if _, err := cli.Put(ctx, key, fmt.Sprintf(`{"pod":%q,"podUID":"uid-%s"}`, pod, pod), clientv3.WithLease(l.ID)); err != nil {
			t.Fatal(err)
		}
		return key
	}
	kept, gone, outside := slot(1, "p"), slot(2, "q"), slot(900, "p2")
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "uid-p", Labels: map[string]string{"app": "x"}}}
	rng := &fencerv1.IDRange{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "ids", UID: "u", Generation: 2},
		Spec: fencerv1.IDRangeSpec{Mode: fencerv1.ModeSlots, Min: 0, Max: 15, SlotTTLSeconds: ptr.To[int32](10),
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "bad value!"}}}}
	api := fake.NewClientBuilder().WithScheme(apiScheme(t)).WithObjects(pod, rng).Build()
	r := NewIDRangeReconciler(api, store, elector, nil, clock.RealClock{})
	r.APIReader = api
	// A pass before renewed every slot; q's pod has gone since.
	r.Renewer.Ensure(gone, leaseOf(t, cli, gone), time.Now())
	if err := api.Get(ctx, client.ObjectKeyFromObject(rng), rng); err != nil {
		t.Fatal(err)
	}
	out, err := r.reconcileRange(ctx, rng)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Renewer.Renewing(kept, leaseOf(t, cli, kept)) {
		t.Error("the slot of pod p, still there, is not renewed")
	}
	if r.Renewer.Renewing(gone, leaseOf(t, cli, gone)) {
		t.Error("the slot of pod q, gone, is renewed")
	}
	if resp, err := cli.Get(ctx, outside); err != nil || len(resp.Kvs) != 0 {
		t.Errorf("slot 900, outside [0, 15], is still there (%v)", err)
	}
	if n := countEvents(out, fencerv1.ReasonInvalidSelector); n != 1 || out.result.RequeueAfter <= 0 {
		t.Errorf("first pass: %d InvalidSelector Events, requeue %s; want 1 and a periodic pass", n, out.result.RequeueAfter)
	}
	again, err := r.reconcileRange(ctx, rng) // the status now says InvalidSelector at this generation
	if err != nil {
		t.Fatal(err)
	}
	if n := countEvents(again, fencerv1.ReasonInvalidSelector); n != 0 {
		t.Errorf("the next pass of the same generation warned again (%d)", n)
	}
	rng.Spec.Mode, rng.Generation = fencerv1.ModeBlocks, 3
	blocks, err := r.reconcileRange(ctx, rng)
	if err != nil {
		t.Fatal(err)
	}
	if countEvents(blocks, fencerv1.ReasonInvalidSelector) != 1 || blocks.result.RequeueAfter != 0 {
		t.Errorf("a Blocks range: %+v; want one Warning for its generation and no periodic pass", blocks)
	}
}

func leaseOf(t *testing.T, cli *clientv3.Client, key string) clientv3.LeaseID {
	t.Helper()
	resp, err := cli.Get(context.Background(), key)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("%s: %v", key, err)
	}
	return clientv3.LeaseID(resp.Kvs[0].Lease)
}

func countEvents(out outcome, reason string) int {
	n := 0
	for _, e := range out.events {
		if e.reason == reason {
			n++
		}
	}
	return n
}
