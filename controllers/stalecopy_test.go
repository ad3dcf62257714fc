package controllers

import (
	"context"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
)

// The tests below are a manager that has just taken over, whose cache of
// one kind is behind what the leader before it wrote: the cache is one
// fake client, the API server another, holding a newer copy of the object.

// newerInAPI stores obj in a fake API server and writes it once more, so
// the API's copy is newer (another resourceVersion) than a cache's copy
// of the object as it first was.
func newerInAPI(t *testing.T, obj client.Object, alsoCurrent ...client.Object) client.Client {
	t.Helper()
	api := fake.NewClientBuilder().WithScheme(apiScheme(t)).WithObjects(append([]client.Object{obj}, alsoCurrent...)...).Build()
	if err := api.Update(context.Background(), obj); err != nil {
		t.Fatal(err)
	}
	return api
}

func readyPod(name, uid, run string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID(uid),
		Labels: map[string]string{jobControllerUID: run}, CreationTimestamp: metav1.NewTime(time.Unix(1700000000, 0))},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}}
}

// The leader before moved a CronJob's member Lease from run j1 to run j2
// and released j1's holder; j2's pod was not granted yet. The new
// leader's Lease cache still shows the selector of j1. Granting on it
// would give the older run's pod a new, greater token, which the webhook
// and the database guard would then accept after the newer run's writes.
func TestANewLeaderGrantsNothingOnALeaseItsCacheIsBehindOn(t *testing.T) {
	_, store, elector := storeWithTerm(t)
	ctx := context.Background()
	lease := func(run string) *fencerv1.Lease {
		return &fencerv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "n", UID: "lease-uid", Generation: 2},
			Spec: fencerv1.LeaseSpec{TTLSeconds: 30, Renewal: fencerv1.RenewalPodReady, SoleCandidate: true, HolderSelector: runSelector(run)}}
	}
	p1, p2 := readyPod("n-1-x", "uid-p1", "j1"), readyPod("n-2-x", "uid-p2", "j2")
	cache := fake.NewClientBuilder().WithScheme(apiScheme(t)).WithStatusSubresource(&fencerv1.Lease{}).
		WithIndex(&corev1.Pod{}, indexPodLease, podLeaseValues).WithIndex(&corev1.Pod{}, indexPodLabel, podLabelValues).
		WithObjects(lease("j1"), p1, p2).Build()
	current := lease("j2")
	current.Generation = 3
	api := newerInAPI(t, current)
	r := NewLeaseReconciler(cache, store, elector, nil, clock.RealClock{})
	r.APIReader = api

	var stale fencerv1.Lease
	if err := cache.Get(ctx, client.ObjectKeyFromObject(current), &stale); err != nil {
		t.Fatal(err)
	}
	out, err := r.reconcileGrant(ctx, &stale)
	if err != nil {
		t.Fatal(err)
	}
	if g, err := store.GetGrant(ctx, "ns", "n"); err != nil || g != nil {
		t.Fatalf("a pass over the cache's older Lease granted %+v (%v); want nothing until the cache catches up", g, err)
	}
	if out.result.RequeueAfter != staleRetry {
		t.Errorf("the pass asked to run again after %s, want %s", out.result.RequeueAfter, staleRetry)
	}

	// The cache catches up: the next pass grants the run the Lease selects.
	if _, err := r.reconcileGrant(ctx, current); err != nil {
		t.Fatal(err)
	}
	if g, err := store.GetGrant(ctx, "ns", "n"); err != nil || g == nil || g.HolderUID != "uid-p2" {
		t.Fatalf("after the cache caught up etcd holds %+v (%v); want a grant to run j2's pod", g, err)
	}
}

// The leader before saw a Lease's suspension lifted, and its holder kept
// the grant. The new leader's cache still shows the Lease suspended:
// ending the tenure on it would take the holder's token for nothing. The
// grant is still adopted at once (its renewal does not wait for the
// cache): only grants and releases do.
func TestANewLeaderEndsNoTenureOnASuspensionItsCacheIsBehindOn(t *testing.T) {
	_, store, elector := storeWithTerm(t)
	ctx := context.Background()
	lease := func(suspend bool) *fencerv1.Lease {
		return &fencerv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "n", UID: "lease-uid", Generation: 2},
			Spec: fencerv1.LeaseSpec{TTLSeconds: 30, Renewal: fencerv1.RenewalPodReady, Suspend: suspend, HolderSelector: runSelector("j1")}}
	}
	p1 := readyPod("n-1-x", "uid-p1", "j1")
	g, err := store.GrantLease(ctx, "ns", "n", "lease-uid", p1.Name, string(p1.UID), 30*time.Second, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	cache := fake.NewClientBuilder().WithScheme(apiScheme(t)).WithStatusSubresource(&fencerv1.Lease{}).
		WithIndex(&corev1.Pod{}, indexPodLease, podLeaseValues).WithIndex(&corev1.Pod{}, indexPodLabel, podLabelValues).
		WithObjects(lease(true), p1).Build()
	r := NewLeaseReconciler(cache, store, elector, nil, clock.RealClock{})
	r.APIReader = newerInAPI(t, lease(false))
	var stale fencerv1.Lease
	if err := cache.Get(ctx, types.NamespacedName{Namespace: "ns", Name: "n"}, &stale); err != nil {
		t.Fatal(err)
	}
	if _, err := r.reconcileGrant(ctx, &stale); err != nil {
		t.Fatal(err)
	}
	if now, err := store.GetGrant(ctx, "ns", "n"); err != nil || now == nil || now.Token != g.Token {
		t.Fatalf("etcd holds %+v (%v) after a pass over the cache's suspended copy; want the grant, token %d, kept", now, err, g.Token)
	}
	if !r.Renewer.Renewing(etcdkeys.LeaseKey(store.Prefix(), "ns", "n"), g.LeaseID) {
		t.Error("the grant kept while the cache is behind is not renewed: it would lapse if the cache stayed behind a TTL")
	}

	// Not suspended in the cache either: the same pass adopts the grant
	// without reading the Lease again.
	r = NewLeaseReconciler(cache, store, elector, nil, clock.RealClock{})
	reads := &countingReader{Reader: r.APIReader}
	r.APIReader = reads
	stale.Spec.Suspend = false
	if _, err := r.reconcileGrant(ctx, &stale); err != nil {
		t.Fatal(err)
	}
	if !r.Renewer.Renewing(etcdkeys.LeaseKey(store.Prefix(), "ns", "n"), g.LeaseID) || reads.gets != 0 {
		t.Errorf("a grant to keep: renewing %v after %d reads of the Lease; want it adopted with none",
			r.Renewer.Renewing(etcdkeys.LeaseKey(store.Prefix(), "ns", "n"), g.LeaseID), reads.gets)
	}
}

// The leader before granted to a pod just relabelled into the selector;
// the new leader's pod cache still shows its old labels. The apiserver
// shows the holder there and selected, so the grant is kept, and, adopted
// here, renewed: it must not lapse while the cache catches up.
func TestANewLeaderRenewsAGrantItsPodCacheIsBehindOn(t *testing.T) {
	_, store, elector := storeWithTerm(t)
	ctx := context.Background()
	lease := &fencerv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "n", UID: "lease-uid", Generation: 2},
		Spec: fencerv1.LeaseSpec{TTLSeconds: 30, Renewal: fencerv1.RenewalPodReady, HolderSelector: runSelector("j1")}}
	p1 := readyPod("n-1-x", "uid-p1", "j1")
	g, err := store.GrantLease(ctx, "ns", "n", "lease-uid", p1.Name, string(p1.UID), 30*time.Second, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	cached := readyPod("n-1-x", "uid-p1", "j0") // before the relabel
	cache := fake.NewClientBuilder().WithScheme(apiScheme(t)).WithStatusSubresource(&fencerv1.Lease{}).
		WithIndex(&corev1.Pod{}, indexPodLease, podLeaseValues).WithIndex(&corev1.Pod{}, indexPodLabel, podLabelValues).
		WithObjects(lease.DeepCopy(), cached).Build()
	r := NewLeaseReconciler(cache, store, elector, nil, clock.RealClock{})
	r.APIReader = fake.NewClientBuilder().WithScheme(apiScheme(t)).WithObjects(lease.DeepCopy(), p1).Build()
	var current fencerv1.Lease
	if err := cache.Get(ctx, types.NamespacedName{Namespace: "ns", Name: "n"}, &current); err != nil {
		t.Fatal(err)
	}
	out, err := r.reconcileGrant(ctx, &current)
	if err != nil {
		t.Fatal(err)
	}
	if now, err := store.GetGrant(ctx, "ns", "n"); err != nil || now == nil || now.Token != g.Token {
		t.Fatalf("etcd holds %+v (%v) after a pass over a pod cache behind the holder; want the grant, token %d, kept", now, err, g.Token)
	}
	if !r.Renewer.Renewing(etcdkeys.LeaseKey(store.Prefix(), "ns", "n"), g.LeaseID) {
		t.Error("the grant kept while the pod cache is behind is not renewed: it would lapse if the cache stayed behind a TTL")
	}
	if out.result.RequeueAfter == 0 {
		t.Error("the pass does not look again once the cache may have caught up")
	}

	// A holder the apiserver shows not Ready is kept until the cache says,
	// but not renewed: it no longer qualifies.
	unready := p1.DeepCopy()
	unready.Status.Conditions[0].Status = corev1.ConditionFalse
	r = NewLeaseReconciler(cache, store, elector, nil, clock.RealClock{})
	r.APIReader = fake.NewClientBuilder().WithScheme(apiScheme(t)).WithObjects(lease.DeepCopy(), unready).Build()
	if _, err := r.reconcileGrant(ctx, &current); err != nil {
		t.Fatal(err)
	}
	if r.Renewer.Renewing(etcdkeys.LeaseKey(store.Prefix(), "ns", "n"), g.LeaseID) {
		t.Error("a holder the apiserver shows not Ready is renewed")
	}
}

// A Lease that grants and releases nothing (no candidate here) makes no
// read of the API whatever its cache shows: after a takeover, idle Leases
// must not queue the grants to adopt behind reads of their own.
func TestAnIdleLeaseReadsNothingAfterATakeover(t *testing.T) {
	_, store, elector := storeWithTerm(t)
	ctx := context.Background()
	cache := fake.NewClientBuilder().WithScheme(apiScheme(t)).WithStatusSubresource(&fencerv1.Lease{}).
		WithIndex(&corev1.Pod{}, indexPodLease, podLeaseValues).WithIndex(&corev1.Pod{}, indexPodLabel, podLabelValues).Build()
	r := NewLeaseReconciler(cache, store, elector, nil, clock.RealClock{})
	reads := &countingReader{} // a read would panic: it has no API behind it
	r.APIReader = reads
	idle := &fencerv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "idle", UID: "idle-uid", ResourceVersion: "1"},
		Spec: fencerv1.LeaseSpec{TTLSeconds: 30, HolderSelector: runSelector("none")}}
	if _, err := r.reconcileGrant(ctx, idle); err != nil {
		t.Fatal(err)
	}
}

// The leader before saw an IDRange's max raised from 3 to 7 and leased
// slot 5. The new leader's cache still shows max 3: releasing slot 5 as
// out of range would free it while its generator runs, long before its
// etcd lease expires.
func TestANewLeaderKeepsASlotAboveAMaxItsCacheIsBehindOn(t *testing.T) {
	cli, store, elector := storeWithTerm(t)
	ctx := context.Background()
	sl, err := store.LeaseSlot(ctx, "ns", "ids", 5, 7, nil, "x", "uid-x", 30*time.Second)
	if err != nil || sl.N != 5 {
		t.Fatalf("lease: %+v %v", sl, err)
	}
	rng := func(max int64) *fencerv1.IDRange {
		return &fencerv1.IDRange{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "ids", UID: "ids-uid"},
			Spec: fencerv1.IDRangeSpec{Mode: fencerv1.ModeSlots, Min: 0, Max: max, SlotTTLSeconds: ptr.To[int32](30),
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{jobControllerUID: "x"}}}}
	}
	pod := readyPod("x", "uid-x", "x")
	cache := fake.NewClientBuilder().WithScheme(apiScheme(t)).WithIndex(&corev1.Pod{}, indexPodLabel, podLabelValues).
		WithObjects(rng(3), pod).Build()
	r := NewIDRangeReconciler(cache, store, elector, nil, clock.RealClock{})
	r.APIReader = newerInAPI(t, rng(7))
	var stale fencerv1.IDRange
	if err := cache.Get(ctx, types.NamespacedName{Namespace: "ns", Name: "ids"}, &stale); err != nil {
		t.Fatal(err)
	}
	if _, err := r.reconcileRange(ctx, &stale); err != nil {
		t.Fatal(err)
	}
	slots, err := store.Slots(ctx, "ns", "ids")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range slots {
		if s.N == 5 && s.Token == sl.Token {
			return
		}
	}
	ttl, _ := cli.TimeToLive(ctx, sl.LeaseID)
	t.Fatalf("slot 5, leased under the raised max, was released on the cache's older max 3 (its etcd lease had %d s left); slots now %+v", ttl.TTL, slots)
}

// The leader before recorded run j2 of a CronJob (started while j1 still
// ran) in the WorkloadLease's status, then moved the member Lease to it.
// The new leader's Lease cache shows the move, but its WorkloadLease cache
// still records j1, and its Job cache has no j2 yet: acting on them would
// move the Lease back to the older run.
func TestANewLeaderMovesNoLeaseOnAWorkloadLeaseItsCacheIsBehindOn(t *testing.T) {
	t0 := time.Unix(1700000000, 0)
	wl := func(run, job string, at time.Time) *fencerv1.WorkloadLease {
		return &fencerv1.WorkloadLease{ObjectMeta: metav1.ObjectMeta{Name: "wl", Namespace: "ns", UID: "wl-uid", Generation: 1},
			Spec: fencerv1.WorkloadLeaseSpec{Workload: fencerv1.WorkloadRef{Kind: fencerv1.WorkloadCronJob, Name: "n"}},
			Status: fencerv1.WorkloadLeaseStatus{CronJobRun: &fencerv1.CronJobRun{LeaseUID: "lease-uid", JobUID: types.UID(run),
				Order: runOrder(runJob(job, run, at)), CronJobUID: "cj"}}}
	}
	stale := wl("j1", "n-1", t0)
	lease := &fencerv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "n", Namespace: "ns", UID: "lease-uid", Generation: 2,
		Labels:          map[string]string{memberOfLabel: "wl"},
		Annotations:     map[string]string{parentGenerationAnnotation: "1"},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "fencer.io/v1alpha1", Kind: "WorkloadLease", Name: "wl", UID: "wl-uid", Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}}},
	}
	memberSpec(&lease.Spec, stale, member{selector: runSelector("j2")})
	cronJob := func() *batchv1.CronJob {
		return &batchv1.CronJob{ObjectMeta: metav1.ObjectMeta{Name: "n", Namespace: "ns", UID: "cj", Generation: 1}}
	}
	c := fake.NewClientBuilder().WithScheme(apiScheme(t)).WithStatusSubresource(&fencerv1.WorkloadLease{}).
		WithObjects(stale, lease, cronJob(), runJob("n-1", "j1", t0)).Build()
	f := &cronJobFixture{c: c, events: events.NewFakeRecorder(100)}
	// Only the WorkloadLease lags: the API's CronJob is the cache's.
	r := &WorkloadLeaseReconciler{APIReader: newerInAPI(t, wl("j2", "n-2", t0.Add(time.Minute)), cronJob())}
	if err := f.reconcile(t, r); err != nil {
		t.Fatal(err)
	}
	if sel, _ := f.selected(t); sel != "j2" {
		t.Errorf("the CronJob's member Lease moved from run j2 back to the older run %q on the cache's older record", sel)
	}
}

// The leader before saw a StatefulSet scaled from 1 to 2 and created the
// Lease of member web-1. The new leader's StatefulSet cache still shows
// one replica: deleting web-1's Lease as a gone member's would end its
// holder's grant, and the member would get a new token once the cache
// caught up, though nothing but the manager changed.
func TestANewLeaderDeletesNoMemberOfAStatefulSetItsCacheIsBehindOn(t *testing.T) {
	ctx := context.Background()
	sts := func(replicas int32) *appsv1.StatefulSet {
		return &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "ns", UID: "sts-uid", Generation: int64(replicas)},
			Spec: appsv1.StatefulSetSpec{Replicas: ptr.To(replicas)}}
	}
	wl := &fencerv1.WorkloadLease{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "ns", UID: "wl-uid"},
		Spec: fencerv1.WorkloadLeaseSpec{Workload: fencerv1.WorkloadRef{Kind: fencerv1.WorkloadStatefulSet, Name: "web"}, TTLSeconds: 30}}
	memberLease := func(name string) *fencerv1.Lease {
		l := &fencerv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID(name + "-uid"),
			Labels:          map[string]string{memberOfLabel: "web"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "fencer.io/v1alpha1", Kind: "WorkloadLease", Name: "web", UID: "wl-uid", Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}}}}
		memberSpec(&l.Spec, wl, member{name: name})
		return l
	}
	cache := fake.NewClientBuilder().WithScheme(apiScheme(t)).WithStatusSubresource(&fencerv1.WorkloadLease{}).
		WithObjects(wl, sts(1), memberLease("web-0"), memberLease("web-1")).Build()
	// Only the StatefulSet lags: the API's WorkloadLease is the cache's.
	api := workloadLeasesFrom{Reader: newerInAPI(t, sts(2)), cache: cache}
	r := &WorkloadLeaseReconciler{Client: cache, Recorder: events.NewFakeRecorder(100), Clock: clock.RealClock{}, APIReader: api}
	if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(wl)}); err != nil {
		t.Fatal(err)
	}
	if err := cache.Get(ctx, client.ObjectKey{Namespace: "ns", Name: "web-1"}, &fencerv1.Lease{}); err != nil {
		t.Fatalf("member web-1's Lease after a pass over the cache's older StatefulSet: %v; want it kept", err)
	}
}

// workloadLeasesFrom is an API server whose WorkloadLeases are the cache's.
type workloadLeasesFrom struct {
	client.Reader
	cache client.Reader
}

func (w workloadLeasesFrom) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if _, ok := obj.(*fencerv1.WorkloadLease); ok {
		return w.cache.Get(ctx, key, obj, opts...)
	}
	return w.Reader.Get(ctx, key, obj, opts...)
}

// A copy written at or after the term began is current without a read; an
// older one is read once a term; a new term reads it again.
func TestStaleCopiesReadsAnOlderCopyOncePerTerm(t *testing.T) {
	ctx := context.Background()
	obj := &fencerv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "l", UID: "u"}}
	reads := &countingReader{Reader: fake.NewClientBuilder().WithScheme(apiScheme(t)).WithObjects(obj).Build()}
	var s staleCopies
	var cached fencerv1.Lease
	if err := reads.Get(ctx, client.ObjectKeyFromObject(obj), &cached); err != nil {
		t.Fatal(err)
	}
	reads.gets = 0
	for i, term := range []string{"a", "a", "b"} {
		behind, err := s.behind(ctx, reads, &fencerv1.LeaseList{}, &cached, term)
		if err != nil || behind {
			t.Fatalf("pass %d: behind %v (%v); the copy is the API's", i, behind, err)
		}
	}
	if reads.gets != 2 {
		t.Errorf("%d reads over two terms, want one a term", reads.gets)
	}
	// The API's resourceVersion at the term's start marks what is current.
	s.since = 1000
	newer := cached.DeepCopy()
	newer.UID, newer.ResourceVersion = "other", "1000"
	if behind, err := s.behind(ctx, reads, &fencerv1.LeaseList{}, newer, "b"); err != nil || behind || reads.gets != 2 {
		t.Errorf("a copy written since the term began: behind %v (%v) after %d reads; want current, read no more", behind, err, reads.gets)
	}
}

type countingReader struct {
	client.Reader
	gets int
}

func (c *countingReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	c.gets++
	return c.Reader.Get(ctx, key, obj, opts...)
}
