package controllers

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
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

// A Job with a manual selector: the apiserver puts no job-name label on its
// pods, so its members select by the Job's own selector and the index,
// without changing the Job's selector.
func TestIndexesOfAJobWithAManualSelector(t *testing.T) {
	sel := &metav1.LabelSelector{MatchLabels: map[string]string{"app": "manual"},
		MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "tier", Operator: metav1.LabelSelectorOpIn, Values: []string{"batch"}}}}
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "manual", UID: "u1"}, Spec: batchv1.JobSpec{
		Completions: ptr.To[int32](2), CompletionMode: ptr.To(batchv1.IndexedCompletion), ManualSelector: ptr.To(true), Selector: sel,
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "manual", "tier": "batch", "run": "r7"}}}}}
	ms, err := indexes(job)
	if err != nil || len(ms) != 2 {
		t.Fatalf("members %+v, %v", ms, err)
	}
	want := metav1.LabelSelector{MatchLabels: map[string]string{"app": "manual", "tier": "batch", "run": "r7", jobCompletionIndex: "1"}, MatchExpressions: sel.MatchExpressions}
	if !equality.Semantic.DeepEqual(ms[1].selector, want) {
		t.Fatalf("manual-1's selector %+v, want %+v", ms[1].selector, want)
	}
	if len(job.Spec.Selector.MatchLabels) != 1 || len(job.Spec.Template.Labels) != 3 {
		t.Fatalf("the Job's own selector or template was changed: %v, %v", job.Spec.Selector.MatchLabels, job.Spec.Template.Labels)
	}
	// An empty selector, which the API accepts: the template's labels
	// still keep other Jobs' pods of the same index out.
	job.Spec.Selector = &metav1.LabelSelector{}
	if ms, err = indexes(job); err != nil || ms[0].selector.MatchLabels["run"] != "r7" || ms[0].selector.MatchLabels[jobCompletionIndex] != "0" {
		t.Fatalf("with an empty selector: %+v, %v; want the template's labels and the index", ms, err)
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

// One member whose Lease cannot be created (a ResourceQuota on Leases,
// another admission policy) holds up neither the other members nor the
// deletion of the members gone; its error is still returned.
func TestOneFailingMemberDoesNotHoldUpTheOthers(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := fencerv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	wl := &fencerv1.WorkloadLease{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "ns", UID: "wl-uid"}}
	gone := &fencerv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "web-5", Namespace: "ns", UID: "gone-uid",
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "fencer.io/v1alpha1", Kind: "WorkloadLease", Name: "web", UID: "wl-uid", Controller: ptr.To(true)}}}}
	quota := apierrors.NewForbidden(schema.GroupResource{Group: "fencer.io", Resource: "leases"}, "web-0", errors.New("exceeded quota: leases"))
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(gone).WithInterceptorFuncs(interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if obj.GetName() == "web-0" {
				return quota
			}
			return c.Create(ctx, obj, opts...)
		},
	}).Build()
	r := &WorkloadLeaseReconciler{Client: c}
	want := []member{{name: "web-0"}, {name: "web-1"}}
	a, err := r.applyMembers(context.Background(), wl, want, &outcome{})
	if !errors.Is(err, quota) {
		t.Fatalf("applyMembers: %v, want web-0's quota error", err)
	}
	if a.members != 1 {
		t.Errorf("%d members applied, want web-1", a.members)
	}
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: "ns", Name: "web-1"}, &fencerv1.Lease{}); err != nil {
		t.Errorf("web-1 after web-0 failed: %v, want it created", err)
	}
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(gone), &fencerv1.Lease{}); !apierrors.IsNotFound(err) {
		t.Errorf("the gone member's Lease: %v, want it deleted", err)
	}
}
