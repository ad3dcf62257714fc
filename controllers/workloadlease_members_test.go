package controllers

import (
	"context"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

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
	at := func(created int64, scheduled, name string) *batchv1.Job {
		j := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.Unix(created, 0)}}
		if scheduled != "" {
			j.Annotations = map[string]string{cronJobScheduled: scheduled}
		}
		return j
	}
	// Created later, scheduled earlier: a late start of an older run.
	late := at(2000, "2026-12-02T03:00:00Z", "nightly-a")
	newer := at(1000, "2026-12-03T03:00:00Z", "nightly-b")
	if runOrder(late) >= runOrder(newer) {
		t.Fatalf("%s ordered after %s", runOrder(late), runOrder(newer))
	}
	if runOrder(at(5, "", "b")) <= runOrder(at(5, "", "a")) || runOrder(at(10, "", "a")) <= runOrder(at(9, "", "z")) {
		t.Fatal("by creation, then by name")
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

// A CronJob's member Lease stays with the run of the pod holding it when
// that run's Job is gone and the newest Job left is older; in every other
// case it is the newest Job's. What a Lease editor can write (annotations,
// the selector) plays no part: only the tenure and the holder's pod do.
func TestCronJobRunStaysOnlyWithTheHolder(t *testing.T) {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, batchv1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	t0 := metav1.Unix(1_700_000_000, 0)
	later := metav1.Unix(t0.Unix()+60, 0)
	older := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "n-1", Namespace: "ns", UID: "j1", CreationTimestamp: t0}}
	deleted := "j2" // run n-2's Job, no longer there
	newest := member{name: "n", cronJob: true, run: "n-1", runUID: "j1", runCreated: t0, selector: runSelector("j1")}
	pod := func(uid types.UID, label, refUID string, created metav1.Time) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "holder", Namespace: "ns", UID: uid, CreationTimestamp: created,
			Labels:          map[string]string{jobControllerUID: label},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "n-2", UID: types.UID(refUID), Controller: ptr.To(true)}}}}
	}
	for _, c := range []struct {
		name     string
		objs     []client.Object
		m        member
		tenure   bool
		wantStay bool
	}{
		{"held by the deleted newer run", []client.Object{older, pod("u2", deleted, deleted, later)}, newest, true, true},
		{"no Job left at all", []client.Object{pod("u2", deleted, deleted, later)}, member{name: "n", cronJob: true, selector: runSelector("cj")}, true, true},
		{"no open tenure", []client.Object{older, pod("u2", deleted, deleted, later)}, newest, false, false},
		{"the holder's pod gone", []client.Object{older}, newest, true, false},
		{"another pod of the holder's name", []client.Object{older, pod("other", deleted, deleted, later)}, newest, true, false},
		{"label and controller disagree", []client.Object{older, pod("u2", deleted, "j9", later)}, newest, true, false},
		{"the holder's Job still there", []client.Object{older, pod("u2", deleted, deleted, later),
			&batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "n-2", Namespace: "ns", UID: types.UID(deleted)}}}, newest, true, false},
		{"the newest Job made after the holder's pod", []client.Object{older, pod("u2", deleted, deleted, t0)}, newest, true, false},
	} {
		r := &WorkloadLeaseReconciler{Client: fake.NewClientBuilder().WithScheme(scheme).WithObjects(c.objs...).Build()}
		l := &fencerv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "n", Namespace: "ns",
			Annotations: map[string]string{"fencer.io/workloadlease-run": "99999999999999999999/x", "fencer.io/workloadlease-run-uid": "forged"}}}
		if c.tenure {
			l.Status.Holder, l.Status.HolderUID, l.Status.Token = "holder", "u2", 7
			l.Status.History = []fencerv1.Tenure{{Holder: "holder", HolderUID: "u2", Token: 7, Start: metav1.NewMicroTime(later.Time)}}
		}
		got, err := r.cronJobRun(context.Background(), l, c.m)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		want := c.m
		if c.wantStay {
			want = member{name: "n", cronJob: true, selector: runSelector(deleted)}
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: %+v, want %+v", c.name, got, want)
		}
	}
}
