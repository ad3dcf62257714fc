package controllers

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
)

// An IDRange stored before the CRD refused a negative min still reaches the
// controller. It must allocate nothing: a negative slot's key is one the
// store cannot list back, so each pass would lease another slot, and a
// negative block is one no pod can parse. The reconciler here has no client
// or etcd, so any allocation attempt fails the test.
func TestNegativeMinAllocatesNothing(t *testing.T) {
	for _, mode := range []fencerv1.IDRangeMode{fencerv1.ModeSlots, fencerv1.ModeBlocks} {
		rng := &fencerv1.IDRange{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "ids", Generation: 2},
			Spec:       fencerv1.IDRangeSpec{Mode: mode, Min: -1000, Max: 1023},
		}
		out, err := (&IDRangeReconciler{}).reconcileRange(context.Background(), rng)
		if err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
		c := meta.FindStatusCondition(rng.Status.Conditions, fencerv1.ConditionReady)
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != fencerv1.ReasonInvalidRange {
			t.Errorf("%s: Ready condition %+v, want False with reason %s", mode, c, fencerv1.ReasonInvalidRange)
		}
		if len(out.events) != 1 || out.events[0].reason != fencerv1.ReasonInvalidRange {
			t.Errorf("%s: events %+v, want one %s Warning", mode, out.events, fencerv1.ReasonInvalidRange)
		}
	}
}

// fencer.io/delete-next-on-delete takes "true" alone; any other value ("True",
// "yes") keeps the next-ID key when the IDRange goes, which fails safe
// (IDs are never reissued) but drops what the user asked: a Warning says
// so while the IDRange lives. (Its spec.min is negative so that the pass
// stops before it needs a client or etcd.)
func TestAnIgnoredDeleteNextValueIsWarnedOf(t *testing.T) {
	for value, warned := range map[string]bool{"True": true, "yes": true, "": true, "true": false} {
		rng := &fencerv1.IDRange{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "ids", Annotations: map[string]string{fencerv1.DeleteNextAnnotation: value}},
			Spec:       fencerv1.IDRangeSpec{Mode: fencerv1.ModeBlocks, Min: -1, Max: 10},
		}
		out, err := (&IDRangeReconciler{}).reconcileRange(context.Background(), rng)
		if err != nil {
			t.Fatal(err)
		}
		got := false
		for _, e := range out.events {
			got = got || e.reason == fencerv1.ReasonIgnoredAnnotation
		}
		if got != warned {
			t.Errorf("%s=%q: events %+v; want an %s Warning: %v", fencerv1.DeleteNextAnnotation, value, out.events, fencerv1.ReasonIgnoredAnnotation, warned)
		}
	}
}

// A finalize that works from a cache behind the API server may be handed an
// IDRange whose finalizer an earlier pass already removed, after a new
// IDRange took its name. It must release nothing: the slots and the next
// key are the new range's. The reconciler has no etcd or elector here, so
// any release attempt fails the test.
func TestFinalizeOfARangeNoLongerThereReleasesNothing(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := fencerv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	stale := &fencerv1.IDRange{ObjectMeta: metav1.ObjectMeta{
		Namespace: "ns", Name: "ids", UID: "old",
		Annotations:       map[string]string{fencerv1.DeleteNextAnnotation: "true"},
		Finalizers:        []string{fencerv1.IDRangeFinalizer},
		DeletionTimestamp: &metav1.Time{Time: time.Now()},
	}}
	recreated := &fencerv1.IDRange{ObjectMeta: metav1.ObjectMeta{
		Namespace: "ns", Name: "ids", UID: "new", Finalizers: []string{fencerv1.IDRangeFinalizer},
	}}
	for name, live := range map[string][]client.Object{"recreated": {recreated}, "gone": nil} {
		api := fake.NewClientBuilder().WithScheme(scheme).WithObjects(live...).Build()
		r := &IDRangeReconciler{Client: api, APIReader: api}
		res, err := r.finalize(context.Background(), stale)
		if err != nil || !res.IsZero() {
			t.Errorf("%s: finalize = %+v, %v; want nothing to do", name, res, err)
		}
	}
}

// The opt-in fencer.io/delete-next-on-delete is read from the API server at
// the finalize, not from the cache: an annotation set just before the
// delete may not have reached the cache, and the next-ID key must go all
// the same (and stay when the API server no longer has the opt-in).
func TestFinalizeTakesTheDeleteNextOptInFromTheAPIServer(t *testing.T) {
	scheme := apiScheme(t)
	cli, store, elector := storeWithTerm(t)
	ctx := context.Background()
	next := etcdkeys.IDRangeNextKey(etcdkeys.DefaultPrefix, "ns", "ids")
	for name, tc := range map[string]struct {
		cached, live map[string]string
		deleted      bool
	}{
		"set after the cache saw the range": {live: map[string]string{fencerv1.DeleteNextAnnotation: "true"}, deleted: true},
		"removed after the cache saw it":    {cached: map[string]string{fencerv1.DeleteNextAnnotation: "true"}},
	} {
		if _, err := cli.Put(ctx, next, "1001"); err != nil {
			t.Fatal(err)
		}
		meta := func(ann map[string]string) metav1.ObjectMeta {
			return metav1.ObjectMeta{
				Namespace: "ns", Name: "ids", UID: "u", Annotations: ann,
				Finalizers: []string{fencerv1.IDRangeFinalizer}, DeletionTimestamp: &metav1.Time{Time: time.Now()},
			}
		}
		api := fake.NewClientBuilder().WithScheme(scheme).WithObjects(&fencerv1.IDRange{ObjectMeta: meta(tc.live)}).Build()
		r := NewIDRangeReconciler(api, store, elector, nil, clock.RealClock{})
		r.APIReader = api
		if _, err := r.finalize(ctx, &fencerv1.IDRange{ObjectMeta: meta(tc.cached)}); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		resp, err := cli.Get(ctx, next)
		if err != nil {
			t.Fatal(err)
		}
		if gone := len(resp.Kvs) == 0; gone != tc.deleted {
			t.Errorf("%s: next key deleted = %v, want %v", name, gone, tc.deleted)
		}
	}
}

// What a manager remembers of an IDRange's blocks goes when the range is
// gone, even if this manager never finalized it (another had the term, or
// the finalizer was removed by hand): a reconcile that finds a range gone
// forgets every range the cache no longer has, and only those.
func TestReconcileOfAGoneRangeForgetsTheRangesGone(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := fencerv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	live := &fencerv1.IDRange{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "live", UID: "live-uid"}}
	api := fake.NewClientBuilder().WithScheme(scheme).WithObjects(live).Build()
	r := &IDRangeReconciler{Client: api, APIReader: api}
	for _, rng := range []types.UID{"live-uid", "gone-uid", "other-gone-uid"} {
		r.handed.put(rng, "pod", "block=1-10")
		r.own.put(rng, "pod", "block=1-10")
		r.own.markForeign(rng, "pod", "block=500-509")
	}
	res, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "gone"}})
	if err != nil || !res.IsZero() {
		t.Fatalf("Reconcile of a gone range = %+v, %v; want nothing to do", res, err)
	}
	for _, rng := range []types.UID{"gone-uid", "other-gone-uid"} {
		if _, ok := r.handed.get(rng, "pod"); ok {
			t.Errorf("range %s: the block handed out is still remembered", rng)
		}
		if r.own.is(rng, "pod", "block=1-10") || r.own.foreign(rng, "pod", "block=500-509") {
			t.Errorf("range %s: a block check is still remembered", rng)
		}
	}
	if _, ok := r.handed.get("live-uid", "pod"); !ok || !r.own.is("live-uid", "pod", "block=1-10") || !r.own.foreign("live-uid", "pod", "block=500-509") {
		t.Error("the memory of a range still there was dropped")
	}
}

// An IDRange deleted and created again under its name, with no pass
// between that found it gone, has the old range's memory dropped at the
// new range's first pass.
func TestReconcileOfARangeCreatedAgainForgetsTheOldOne(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := fencerv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	// Being deleted, held by another's finalizer: the pass does nothing
	// else, and needs no etcd.
	rangeWith := func(uid types.UID) client.Client {
		rng := &fencerv1.IDRange{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "ids", UID: uid,
			DeletionTimestamp: &metav1.Time{Time: time.Unix(1700000000, 0)}, Finalizers: []string{"example.com/hold"}}}
		return fake.NewClientBuilder().WithScheme(scheme).WithObjects(rng).Build()
	}
	r := &IDRangeReconciler{}
	pass := func(uid types.UID) {
		t.Helper()
		r.Client = rangeWith(uid)
		r.APIReader = r.Client
		if _, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "ids"}}); err != nil {
			t.Fatal(err)
		}
	}
	remember := func(rng types.UID) {
		r.handed.put(rng, "pod", "block=1-10")
		r.own.put(rng, "pod", "block=1-10")
	}
	remembered := func(rng types.UID) bool {
		_, handed := r.handed.get(rng, "pod")
		return handed || r.own.is(rng, "pod", "block=1-10")
	}
	pass("old-uid")
	remember("old-uid")
	pass("old-uid")
	if !remembered("old-uid") {
		t.Fatal("a second pass over the same range dropped its memory")
	}
	pass("new-uid")
	remember("new-uid")
	if remembered("old-uid") {
		t.Error("the range created again under the name left the old range's memory behind")
	}
	pass("new-uid")
	if !remembered("new-uid") {
		t.Error("the new range's memory was dropped")
	}
}
