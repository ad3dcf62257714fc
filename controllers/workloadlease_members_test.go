package controllers

import (
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
)

func TestOrdinalsFollowTheStatefulSet(t *testing.T) {
	sts := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: "db"}, Spec: appsv1.StatefulSetSpec{
		Replicas: ptr.To[int32](2), Ordinals: &appsv1.StatefulSetOrdinals{Start: 5},
		Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db", statefulSetPodName: "wrong"}},
	}}
	ms, err := ordinals(sts)
	if err != nil || len(ms) != 2 || ms[0].name != "db-5" || ms[1].name != "db-6" {
		t.Fatalf("members %+v, want db-5 and db-6 (spec.ordinals.start)", ms)
	}
	if got := ms[1].selector.MatchLabels; got["app"] != "db" || got[statefulSetPodName] != "db-6" {
		t.Fatalf("db-6's selector %v: the StatefulSet's, with its own pod name", got)
	}
	if sts.Spec.Selector.MatchLabels[statefulSetPodName] != "wrong" {
		t.Fatal("the StatefulSet's own selector was changed")
	}
	if ms, _ := ordinals(&appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: "one"}}); len(ms) != 1 || ms[0].name != "one-0" {
		t.Fatalf("no replicas set: %+v, want one-0", ms)
	}
}

func TestIndexesOfAnIndexedJobOnly(t *testing.T) {
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "shard", UID: "u1"}, Spec: batchv1.JobSpec{Completions: ptr.To[int32](3)}}
	var none *noMembers
	if _, err := indexes(job); !errors.As(err, &none) || none.reason != fencerv1.ReasonNotIndexed {
		t.Fatalf("a NonIndexed Job: %v, want NotIndexed", err)
	}
	job.Spec.CompletionMode = ptr.To(batchv1.IndexedCompletion)
	ms, err := indexes(job)
	if err != nil || len(ms) != 3 || ms[2].name != "shard-2" {
		t.Fatalf("members %+v, %v", ms, err)
	}
	if got := ms[2].selector.MatchLabels; got[jobName] != "shard" || got[jobCompletionIndex] != "2" || got[jobControllerUID] != "" {
		t.Fatalf("shard-2's selector %v: index 2 of every Job named shard (a re-created Job's pods wait for the old one's)", got)
	}
}

func TestRunOrderPrefersTheScheduledTime(t *testing.T) {
	at := func(created time.Time, scheduled, name string) *batchv1.Job {
		j := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(created)}}
		if scheduled != "" {
			j.Annotations = map[string]string{cronJobScheduled: scheduled}
		}
		return j
	}
	day := func(d, h int) time.Time { return time.Date(2026, 12, d, h, 0, 0, 0, time.UTC) }
	// Created later, scheduled earlier: a late start of an older run.
	late := at(day(3, 5), "2026-12-02T03:00:00Z", "nightly-a")
	newer := at(day(3, 3), "2026-12-03T03:00:00Z", "nightly-b")
	if runOrder(late) >= runOrder(newer) {
		t.Fatalf("%s ordered after %s", runOrder(late), runOrder(newer))
	}
	if runOrder(at(day(1, 5), "", "b")) <= runOrder(at(day(1, 5), "", "a")) || runOrder(at(day(1, 10), "", "a")) <= runOrder(at(day(1, 9), "", "z")) {
		t.Fatal("by creation, then by name")
	}
	// A scheduled time after the Job's creation is no real run's: such a
	// Job ranks by its creation, below a run created after it.
	forged := at(day(3, 4), "2100-01-01T00:00:00Z", "zz-forged")
	next := at(day(4, 3), "2026-12-04T03:00:00Z", "nightly-c")
	if runOrder(forged) >= runOrder(next) {
		t.Fatalf("a Job claiming to be scheduled in 2100 (%s) outranks the run created after it (%s)", runOrder(forged), runOrder(next))
	}
	if runOrder(forged) <= runOrder(newer) {
		t.Fatalf("the Job created after run %s ranks below it: %s", runOrder(newer), runOrder(forged))
	}
}

// A workload of more members than a WorkloadLease leases is refused before
// anything is allocated for them (the API bounds neither replicas nor
// completions), and ordinals near the int32 limit do not overflow.
func TestTooManyMembers(t *testing.T) {
	var none *noMembers
	huge := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: "db"}, Spec: appsv1.StatefulSetSpec{Replicas: ptr.To[int32](math.MaxInt32)}}
	if _, err := ordinals(huge); !errors.As(err, &none) || none.reason != fencerv1.ReasonTooManyMembers || !strings.Contains(none.message, "at most 10000 members") {
		t.Fatalf("a StatefulSet of 2^31-1 replicas: %v, want TooManyMembers", err)
	}
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "shard"}, Spec: batchv1.JobSpec{Completions: ptr.To[int32](math.MaxInt32), CompletionMode: ptr.To(batchv1.IndexedCompletion)}}
	if _, err := indexes(job); !errors.As(err, &none) || none.reason != fencerv1.ReasonTooManyMembers {
		t.Fatalf("an Indexed Job of 2^31-1 completions: %v, want TooManyMembers", err)
	}
	edge := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: "db"}, Spec: appsv1.StatefulSetSpec{
		Replicas: ptr.To[int32](2), Ordinals: &appsv1.StatefulSetOrdinals{Start: math.MaxInt32 - 1}}}
	ms, err := ordinals(edge)
	if err != nil || len(ms) != 2 || ms[1].name != "db-2147483647" {
		t.Fatalf("ordinals from 2^31-2: %+v, %v", ms, err)
	}
	at := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: "db"}, Spec: appsv1.StatefulSetSpec{Replicas: ptr.To[int32](fencerv1.MaxWorkloadMembers)}}
	if ms, err := ordinals(at); err != nil || len(ms) != fencerv1.MaxWorkloadMembers {
		t.Fatalf("exactly the limit: %d members, %v", len(ms), err)
	}
}

// A CronJob's member Lease stays with the run this process last selected
// for it when that run is newer than the newest Job left (its Job was
// deleted); otherwise it is the newest Job's. What a Lease editor can write
// (annotations, the selector) plays no part, and a run this process never
// selected (before a restart) is not stayed on.
func TestCronJobRunStaysOnTheRunItSelected(t *testing.T) {
	older := member{name: "n", cronJob: true, run: "n-1", runUID: "j1", runOrder: "00000000001700000000/n-1", selector: runSelector("j1")}
	newer := member{name: "n", cronJob: true, run: "n-3", runUID: "j3", runOrder: "00000000001700000200/n-3", selector: runSelector("j3")}
	none := member{name: "n", cronJob: true, selector: runSelector("cj")}
	deleted := selectedRun{uid: "j2", order: "00000000001700000100/n-2"}
	stay := member{name: "n", cronJob: true, runUID: "j2", runOrder: deleted.order, selector: runSelector("j2")}
	wl := &fencerv1.WorkloadLease{ObjectMeta: metav1.ObjectMeta{Name: "wl", Namespace: "ns"}}
	key := client.ObjectKeyFromObject(wl)
	l := &fencerv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "n", Namespace: "ns", UID: "lease-uid",
		Annotations: map[string]string{"fencer.io/workloadlease-run": "99999999999999999999/x", "fencer.io/workloadlease-run-uid": "forged"}},
		Spec: fencerv1.LeaseSpec{HolderSelector: runSelector("forged")}}
	for _, c := range []struct {
		name     string
		selected *selectedRun
		m, want  member
	}{
		{"the selected run's Job deleted, an older one left", &deleted, older, stay},
		{"the selected run's Job deleted, none left", &deleted, none, stay},
		{"a newer run", &deleted, newer, newer},
		{"the selected run is the newest", &selectedRun{uid: "j1", order: older.runOrder}, older, older},
		{"nothing selected by this process (a restart)", nil, older, older},
	} {
		var r WorkloadLeaseReconciler
		if c.selected != nil {
			r.runs.remember(key, l.Name, l.UID, *c.selected)
		}
		if got := r.cronJobRun(wl, l, c.m); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
	for _, c := range []struct {
		name   string
		forget func(*selectedRuns)
		l      *fencerv1.Lease
	}{
		{"the member is gone", func(s *selectedRuns) { s.keepOnly(key, map[string]bool{"other": true}) }, l},
		{"the WorkloadLease is deleted", func(s *selectedRuns) { s.forgetAll(key) }, l},
		{"the Lease was re-created under its name", func(*selectedRuns) {}, &fencerv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "n", Namespace: "ns", UID: "new-uid"}}},
	} {
		var r WorkloadLeaseReconciler
		r.runs.remember(key, l.Name, l.UID, deleted)
		c.forget(&r.runs)
		if got := r.cronJobRun(wl, c.l, older); !reflect.DeepEqual(got, older) {
			t.Errorf("%s: it stays on %+v", c.name, got)
		}
	}
	// A write whose answer was an error: stayed on only if the Lease shows
	// it was applied after all.
	tried := selectedRun{uid: "j4", order: "00000000001700000300/n-4"}
	var w WorkloadLeaseReconciler
	w.runs.remember(key, l.Name, l.UID, deleted)
	w.runs.try(key, l.Name, l.UID, tried)
	if got := w.cronJobRun(wl, l, older); !reflect.DeepEqual(got, stay) {
		t.Errorf("a failed write the Lease does not show: %+v, want the run written before it", got)
	}
	applied := l.DeepCopy()
	applied.Spec.HolderSelector = runSelector("j4")
	if got, want := w.cronJobRun(wl, applied, older), (member{name: "n", cronJob: true, runUID: "j4", runOrder: tried.order, selector: runSelector("j4")}); !reflect.DeepEqual(got, want) {
		t.Errorf("a failed write the Lease shows was applied: %+v, want %+v", got, want)
	}
	var r WorkloadLeaseReconciler
	r.runs.remember(key, l.Name, l.UID, deleted)
	r.runs.keepOnly(key, map[string]bool{l.Name: true})
	if got := r.cronJobRun(wl, l, older); !reflect.DeepEqual(got, stay) {
		t.Errorf("a member still wanted lost its run: %+v", got)
	}
	if len(r.runs.runs) != 1 {
		t.Errorf("runs of %d WorkloadLeases kept, want 1", len(r.runs.runs))
	}
	r.runs.forgetAll(key)
	if len(r.runs.runs) != 0 {
		t.Errorf("runs of %d WorkloadLeases kept after the only one's deletion", len(r.runs.runs))
	}
}

// The run a CronJob's member Lease stays with outlives the process that
// selected it: each pass records it in the WorkloadLease's status, and a
// process with no run of its own for the Lease (a restart, a failover)
// takes the recorded one. A run of the process's own wins over the record,
// a record made for another Lease of the name counts for nothing, and
// other workloads record nothing.
func TestCronJobRunRecordedInStatusOutlivesTheProcess(t *testing.T) {
	older := member{name: "n", cronJob: true, run: "n-1", runUID: "j1", runOrder: "00000000001700000000/n-1", selector: runSelector("j1")}
	deleted := selectedRun{uid: "j2", order: "00000000001700000100/n-2"}
	stay := member{name: "n", cronJob: true, runUID: "j2", runOrder: deleted.order, selector: runSelector("j2")}
	wl := &fencerv1.WorkloadLease{ObjectMeta: metav1.ObjectMeta{Name: "wl", Namespace: "ns"},
		Spec: fencerv1.WorkloadLeaseSpec{Workload: fencerv1.WorkloadRef{Kind: fencerv1.WorkloadCronJob, Name: "n"}}}
	key := client.ObjectKeyFromObject(wl)
	l := &fencerv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "n", Namespace: "ns", UID: "lease-uid"}}

	var before WorkloadLeaseReconciler
	if rec := before.runs.record(wl); rec != nil {
		t.Fatalf("a process that selected nothing records %+v", rec)
	}
	before.runs.remember(key, l.Name, l.UID, deleted)
	rec := before.runs.record(wl)
	if want := (&fencerv1.CronJobRun{LeaseUID: "lease-uid", JobUID: "j2", Order: deleted.order}); !reflect.DeepEqual(rec, want) {
		t.Fatalf("recorded %+v, want %+v", rec, want)
	}
	wl.Status.CronJobRun = rec

	var after WorkloadLeaseReconciler
	after.runs.recall(wl)
	if got := after.cronJobRun(wl, l, older); !reflect.DeepEqual(got, stay) {
		t.Errorf("a new process: %+v, want the recorded run %+v", got, stay)
	}
	if got := after.runs.record(wl); !reflect.DeepEqual(got, rec) {
		t.Errorf("a new process records %+v, want %+v", got, rec)
	}

	var own WorkloadLeaseReconciler
	newer := selectedRun{uid: "j3", order: "00000000001700000200/n-3"}
	own.runs.remember(key, l.Name, l.UID, newer)
	own.runs.recall(wl)
	if got := own.runs.record(wl); got == nil || got.JobUID != "j3" {
		t.Errorf("the record replaced the process's own run: %+v", got)
	}

	var recreated WorkloadLeaseReconciler
	recreated.runs.recall(wl)
	again := &fencerv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "n", Namespace: "ns", UID: "new-uid"}}
	if got := recreated.cronJobRun(wl, again, older); !reflect.DeepEqual(got, older) {
		t.Errorf("a Lease created again under the name stays on the old Lease's run: %+v", got)
	}

	sts := wl.DeepCopy()
	sts.Spec.Workload = fencerv1.WorkloadRef{Kind: fencerv1.WorkloadStatefulSet, Name: "n"}
	var other WorkloadLeaseReconciler
	other.runs.recall(sts)
	if len(other.runs.runs) != 0 || before.runs.record(sts) != nil {
		t.Error("a StatefulSet's WorkloadLease recalls or records a run")
	}
}

// A gone member's Lease is deleted only if it is still the Lease the cache
// showed: the delete names its UID. The apiserver here holds a Lease of
// that name created since, another's, and refuses a delete naming
// another UID with a conflict, as the real one does; deleteGone leaves it
// alone and does not fail. Deleted by name alone, it was lost.
func TestDeleteGoneDeletesOnlyTheLeaseItSaw(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := fencerv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	wl := &fencerv1.WorkloadLease{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "ns", UID: "wl-uid"}}
	seen := &fencerv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "web-2", Namespace: "ns", UID: "member-uid",
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "fencer.io/v1alpha1", Kind: "WorkloadLease", Name: "web", UID: "wl-uid", Controller: ptr.To(true)}}}}
	var deletedOthers bool
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(seen).WithInterceptorFuncs(interceptor.Funcs{
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			o := &client.DeleteOptions{}
			o.ApplyOptions(opts)
			if o.Preconditions != nil && o.Preconditions.UID != nil && *o.Preconditions.UID != "others-uid" {
				return apierrors.NewConflict(schema.GroupResource{Group: "fencer.io", Resource: "leases"}, obj.GetName(),
					fmt.Errorf("Precondition failed: UID in precondition: %s, UID in object meta: others-uid", *o.Preconditions.UID))
			}
			deletedOthers = true
			return nil
		},
	}).Build()
	r := &WorkloadLeaseReconciler{Client: c}
	if err := r.deleteGone(context.Background(), wl, map[string]bool{"web-0": true}); err != nil {
		t.Fatalf("deleteGone: %v", err)
	}
	if deletedOthers {
		t.Fatal("deleteGone deleted the Lease that took the gone member's name since the cache saw it")
	}
	// Still the Lease it saw: deleted.
	r = &WorkloadLeaseReconciler{Client: fake.NewClientBuilder().WithScheme(scheme).WithObjects(seen.DeepCopy()).Build()}
	if err := r.deleteGone(context.Background(), wl, map[string]bool{"web-0": true}); err != nil {
		t.Fatalf("deleteGone: %v", err)
	}
	if err := r.Get(context.Background(), client.ObjectKeyFromObject(seen), &fencerv1.Lease{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the gone member's own Lease after deleteGone: %v, want it deleted", err)
	}
}
