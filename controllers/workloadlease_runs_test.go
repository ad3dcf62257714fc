package controllers

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
)

// recordRun records run for member Lease l of wl, as a pass whose status
// write succeeded does.
func recordRun(s *selectedRuns, wl types.NamespacedName, l *fencerv1.Lease, run selectedRun) {
	s.propose(wl, l.Name, l.UID, run)
	s.written(wl)
}

// A CronJob's member Lease stays with the run recorded for it when that
// run is newer than the newest Job left (its Job was deleted); otherwise
// it is the newest Job's, which is recorded before the Lease moves to it.
// What a Lease editor can write (annotations, the selector) plays no part.
func TestCronJobRunStaysOnTheRunRecorded(t *testing.T) {
	older := member{name: "n", cronJob: true, cronJobUID: "cj", run: "n-1", runUID: "j1", runOrder: "00000000001700000000/n-1", selector: runSelector("j1")}
	newer := member{name: "n", cronJob: true, cronJobUID: "cj", run: "n-3", runUID: "j3", runOrder: "00000000001700000200/n-3", selector: runSelector("j3")}
	none := member{name: "n", cronJob: true, cronJobUID: "cj", selector: runSelector("cj")}
	deleted := selectedRun{uid: "j2", order: "00000000001700000100/n-2", cronJob: "cj"}
	stay := member{name: "n", cronJob: true, cronJobUID: "cj", runUID: "j2", runOrder: deleted.order, selector: runSelector("j2")}
	wl := &fencerv1.WorkloadLease{ObjectMeta: metav1.ObjectMeta{Name: "wl", Namespace: "ns"},
		Spec: fencerv1.WorkloadLeaseSpec{Workload: fencerv1.WorkloadRef{Kind: fencerv1.WorkloadCronJob, Name: "n"}}}
	key := client.ObjectKeyFromObject(wl)
	l := &fencerv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "n", Namespace: "ns", UID: "lease-uid",
		Annotations: map[string]string{"fencer.io/workloadlease-run": "99999999999999999999/x", "fencer.io/workloadlease-run-uid": "forged"}},
		Spec: fencerv1.LeaseSpec{HolderSelector: runSelector("forged")}}
	for _, c := range []struct {
		name         string
		recorded     *selectedRun
		m, want      member
		wantRecorded bool
	}{
		{"the recorded run's Job deleted, an older one left", &deleted, older, stay, true},
		{"the recorded run's Job deleted, none left", &deleted, none, stay, true},
		{"a newer run: proposed, not recorded yet", &deleted, newer, newer, false},
		{"the recorded run is the newest", &selectedRun{uid: "j1", order: older.runOrder, cronJob: "cj"}, older, older, true},
		{"the recorded run is the newest, recorded with no CronJob UID: recorded again", &selectedRun{uid: "j1", order: older.runOrder}, older, older, false},
		{"nothing recorded", nil, older, older, false},
		{"nothing recorded and no run", nil, none, none, true},
	} {
		var r WorkloadLeaseReconciler
		if c.recorded != nil {
			recordRun(&r.runs, key, l, *c.recorded)
		}
		got, recorded := r.cronJobRun(wl, l, c.m)
		if !reflect.DeepEqual(got, c.want) || recorded != c.wantRecorded {
			t.Errorf("%s: %+v, recorded %v; want %+v, %v", c.name, got, recorded, c.want, c.wantRecorded)
		}
		if want := c.want.runUID; !c.wantRecorded {
			if rec := r.runs.record(wl); rec == nil || string(rec.JobUID) != want {
				t.Errorf("%s: the status would record %+v, want the run of %s", c.name, rec, want)
			}
		}
	}
	for _, c := range []struct {
		name   string
		forget func(*selectedRuns)
		l      *fencerv1.Lease
	}{
		{"the member is gone", func(s *selectedRuns) { s.keepOnly(key, map[string]bool{"other": true}) }, l},
		{"the WorkloadLease is deleted", func(s *selectedRuns) { s.forgetAll(key) }, l},
	} {
		var r WorkloadLeaseReconciler
		recordRun(&r.runs, key, l, deleted)
		c.forget(&r.runs)
		if got, _ := r.cronJobRun(wl, c.l, older); !reflect.DeepEqual(got, older) {
			t.Errorf("%s: it stays on %+v", c.name, got)
		}
	}
	// The member Lease deleted by hand and created again under its name:
	// the new Lease never goes back to a run older than the one recorded
	// for the Lease before it; that run is proposed for the new Lease, to
	// be recorded before the Lease moves there.
	{
		var r WorkloadLeaseReconciler
		recordRun(&r.runs, key, l, deleted)
		again := &fencerv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "n", Namespace: "ns", UID: "new-uid"}}
		if got, recorded := r.cronJobRun(wl, again, older); !reflect.DeepEqual(got, stay) || recorded {
			t.Errorf("the Lease created again under its name: %+v, recorded %v; want the run recorded for the Lease before it, proposed", got, recorded)
		}
		if rec := r.runs.record(wl); rec == nil || rec.LeaseUID != "new-uid" || string(rec.JobUID) != deleted.uid {
			t.Errorf("the Lease created again under its name: the status would record %+v, want run j2 for Lease new-uid", rec)
		}
		var fresh WorkloadLeaseReconciler
		recordRun(&fresh.runs, key, l, deleted)
		if got, _ := fresh.cronJobRun(wl, again, newer); !reflect.DeepEqual(got, newer) {
			t.Errorf("the Lease created again under its name, and a newer run: %+v, want the newer run", got)
		}
	}
	// No floor from a run of another CronJob (the WorkloadLease moved to
	// another CronJob of the member's name, or it was created again), nor
	// from a record that names no CronJob.
	for _, c := range []struct {
		name    string
		cronJob string
	}{{"another CronJob's run", "other-cj"}, {"a run of no known CronJob", ""}} {
		var r WorkloadLeaseReconciler
		before := deleted
		before.cronJob = c.cronJob
		recordRun(&r.runs, key, l, before)
		again := &fencerv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "n", Namespace: "ns", UID: "new-uid"}}
		if got, _ := r.cronJobRun(wl, again, older); !reflect.DeepEqual(got, older) {
			t.Errorf("%s, recorded for the Lease before: the new Lease goes to %+v, want the newest Job's run", c.name, got)
		}
	}
	// A run proposed in a pass whose status write did not land is not
	// recorded: the next pass starts from the run recorded before it.
	var r WorkloadLeaseReconciler
	recordRun(&r.runs, key, l, deleted)
	r.runs.propose(key, l.Name, l.UID, selectedRun{uid: "j4", order: "00000000001700000300/n-4"})
	r.runs.startPass(context.Background(), wl, time.Now())
	if got, recorded := r.cronJobRun(wl, l, older); !reflect.DeepEqual(got, stay) || !recorded {
		t.Errorf("after a proposal that was never written: %+v, recorded %v; want the run recorded before it", got, recorded)
	}
	r.runs.keepOnly(key, map[string]bool{l.Name: true})
	if len(r.runs.runs) != 1 {
		t.Errorf("runs of %d WorkloadLeases kept, want 1", len(r.runs.runs))
	}
	r.runs.forgetAll(key)
	if len(r.runs.runs) != 0 {
		t.Errorf("runs of %d WorkloadLeases kept after the only one's deletion", len(r.runs.runs))
	}
}

// A pass takes the run the WorkloadLease's status records when this
// process knows none for the Lease, or an older one (another process
// moved the Lease since); one recorded for another Lease of the name (a
// member Lease deleted and created again) only as a floor; never one whose
// time no run can have. A record of another Lease of the name leaves what
// this process knows of its own. Other workloads record nothing.
func TestCronJobRunRecalledFromTheStatus(t *testing.T) {
	now := time.Unix(1700000500, 0)
	older := member{name: "n", cronJob: true, cronJobUID: "cj", run: "n-1", runUID: "j1", runOrder: "00000000001700000000/n-1", selector: runSelector("j1")}
	j2 := selectedRun{uid: "j2", order: "00000000001700000100/n-2", cronJob: "cj"}
	j3 := selectedRun{uid: "j3", order: "00000000001700000200/n-3", cronJob: "cj"}
	otherCronJob := selectedRun{uid: "k2", order: j2.order, cronJob: "other-cj"}
	noCronJob := selectedRun{uid: "j2", order: j2.order}
	l := &fencerv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "n", Namespace: "ns", UID: "lease-uid"}}
	withRecord := func(run selectedRun, lease types.UID) *fencerv1.WorkloadLease {
		return &fencerv1.WorkloadLease{ObjectMeta: metav1.ObjectMeta{Name: "wl", Namespace: "ns"},
			Spec:   fencerv1.WorkloadLeaseSpec{Workload: fencerv1.WorkloadRef{Kind: fencerv1.WorkloadCronJob, Name: "n"}},
			Status: fencerv1.WorkloadLeaseStatus{CronJobRun: &fencerv1.CronJobRun{LeaseUID: lease, JobUID: types.UID(run.uid), Order: run.order, CronJobUID: types.UID(run.cronJob)}}}
	}
	key := types.NamespacedName{Namespace: "ns", Name: "wl"}
	for _, c := range []struct {
		name string
		own  *selectedRun
		wl   *fencerv1.WorkloadLease
		want string
	}{
		{"a new process", nil, withRecord(j2, l.UID), "j2"},
		{"a record newer than the process's own", &j2, withRecord(j3, l.UID), "j3"},
		{"a record older than the process's own", &j3, withRecord(j2, l.UID), "j3"},
		// The member Lease was deleted and created again: the old Lease's
		// run is the floor of the new one's.
		{"a record for another Lease of the name", nil, withRecord(j2, "old-lease-uid"), "j2"},
		{"a record for another Lease of the name, another CronJob's run", nil, withRecord(otherCronJob, "old-lease-uid"), "j1"},
		{"a record for another Lease of the name, no CronJob named", nil, withRecord(noCronJob, "old-lease-uid"), "j1"},
		{"a record for this Lease, no CronJob named (written before fencer recorded it)", nil, withRecord(noCronJob, l.UID), "j2"},
		// The member Lease was deleted and created again, and its run
		// recorded; the cache does not show that write yet.
		{"a record for the Lease before this one", &j2, withRecord(j3, "old-lease-uid"), "j2"},
		{"a record of a time to come", nil, withRecord(selectedRun{uid: "forged", order: "99999999999999999999/forged"}, l.UID), "j1"},
		{"a record that is no run order", nil, withRecord(selectedRun{uid: "forged", order: "forged"}, l.UID), "j1"},
	} {
		var r WorkloadLeaseReconciler
		if c.own != nil {
			recordRun(&r.runs, key, l, *c.own)
		}
		r.runs.startPass(context.Background(), c.wl, now)
		if got, _ := r.cronJobRun(c.wl, l, older); got.runUID != c.want {
			t.Errorf("%s: the Lease selects run %q, want %q", c.name, got.runUID, c.want)
		}
	}
	// The WorkloadLease deleted and created again under its name, and no
	// pass saw it gone: the new one, its status empty, starts with none
	// of the old one's runs.
	var again WorkloadLeaseReconciler
	old := withRecord(j2, l.UID)
	old.UID = "old-wl-uid"
	again.runs.startPass(context.Background(), old, now)
	recreated := withRecord(j2, l.UID)
	recreated.UID, recreated.Status.CronJobRun = "new-wl-uid", nil
	again.runs.startPass(context.Background(), recreated, now)
	if rec := again.runs.record(recreated); rec != nil {
		t.Errorf("a WorkloadLease created again under its name records the old one's run %+v", rec)
	}
	sts := withRecord(j2, l.UID)
	sts.Spec.Workload.Kind = fencerv1.WorkloadStatefulSet
	var r WorkloadLeaseReconciler
	r.runs.startPass(context.Background(), sts, now)
	if len(r.runs.runs) != 0 || r.runs.record(sts) != nil {
		t.Error("a StatefulSet's WorkloadLease recalls or records a run")
	}
}

// cronJobFixture is a CronJob WorkloadLease whose member Lease selects
// run j2, against a fake apiserver whose writes of WorkloadLease status or
// of Leases can be made to fail.
type cronJobFixture struct {
	c                         client.Client
	failStatus, failLeaseUpdt bool
	events                    *events.FakeRecorder
}

func (f *cronJobFixture) reconcile(t *testing.T, r *WorkloadLeaseReconciler) error {
	t.Helper()
	r.Client, r.Recorder = f.c, f.events
	r.Clock = clocktesting.NewFakeClock(time.Unix(1700001000, 0))
	_, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "wl"}})
	return err
}

// selected is the Job UID the member Lease selects, and the one the
// WorkloadLease's status records.
func (f *cronJobFixture) selected(t *testing.T) (lease, record string) {
	t.Helper()
	var l fencerv1.Lease
	var wl fencerv1.WorkloadLease
	if err := f.c.Get(context.Background(), client.ObjectKey{Namespace: "ns", Name: "n"}, &l); err != nil {
		t.Fatal(err)
	}
	if err := f.c.Get(context.Background(), client.ObjectKey{Namespace: "ns", Name: "wl"}, &wl); err != nil {
		t.Fatal(err)
	}
	if rec := wl.Status.CronJobRun; rec != nil {
		record = string(rec.JobUID)
	}
	return l.Spec.HolderSelector.MatchLabels[jobControllerUID], record
}

// takeovers drains the Events posted so far and returns the Takeover
// ones, and the Warnings.
func (f *cronJobFixture) takeovers() (takeovers, warnings []string) {
	for {
		select {
		case e := <-f.events.Events:
			switch {
			case strings.Contains(e, " "+fencerv1.ReasonTakeover+" "):
				takeovers = append(takeovers, e)
			case strings.HasPrefix(e, corev1.EventTypeWarning):
				warnings = append(warnings, e)
			}
		default:
			return takeovers, warnings
		}
	}
}

func runJob(name, uid string, at time.Time) *batchv1.Job {
	return &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID(uid),
		CreationTimestamp: metav1.NewTime(at),
		OwnerReferences:   []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "CronJob", Name: "n", UID: "cj", Controller: ptr.To(true)}}}}
}

// A CronJob's Lease moves to a run only once its WorkloadLease's status
// records it, so a manager that starts later (a restart, a failover) never
// finds the Lease on a run newer than the record and takes it back to an
// older run: the record is always at or past the Lease.
func TestCronJobLeaseMovesOnlyAfterTheRecord(t *testing.T) {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{fencerv1.AddToScheme, batchv1.AddToScheme, appsv1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	t0 := time.Unix(1700000000, 0)
	f := &cronJobFixture{events: events.NewFakeRecorder(100)}
	created := 0
	f.c = fake.NewClientBuilder().WithScheme(scheme).WithStatusSubresource(&fencerv1.WorkloadLease{}).
		WithObjects(
			&fencerv1.WorkloadLease{ObjectMeta: metav1.ObjectMeta{Name: "wl", Namespace: "ns", UID: "wl-uid", Generation: 1},
				Spec: fencerv1.WorkloadLeaseSpec{Workload: fencerv1.WorkloadRef{Kind: fencerv1.WorkloadCronJob, Name: "n"}}},
			&batchv1.CronJob{ObjectMeta: metav1.ObjectMeta{Name: "n", Namespace: "ns", UID: "cj"}},
			runJob("n-1", "j1", t0), runJob("n-2", "j2", t0.Add(100*time.Second))).
		WithInterceptorFuncs(interceptor.Funcs{
			Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
				if obj.GetUID() == "" {
					created++ // a new UID for each object, as the apiserver gives; the fake gives none
					obj.SetUID(types.UID(fmt.Sprintf("uid-of-%s-%d", obj.GetName(), created)))
				}
				return c.Create(ctx, obj, opts...)
			},
			SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
				if _, ok := obj.(*fencerv1.WorkloadLease); ok && f.failStatus {
					return errors.New("status write: timeout")
				}
				return c.SubResource(sub).Update(ctx, obj, opts...)
			},
			Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
				if _, ok := obj.(*fencerv1.Lease); ok && f.failLeaseUpdt {
					return errors.New("lease write: timeout")
				}
				return c.Update(ctx, obj, opts...)
			},
		}).Build()
	// pass runs one pass of manager r, with the write that failing flags
	// (if any) failing, and checks the run the Lease selects and the run
	// the status records after it.
	// A Takeover Event is posted once per move of the Lease to a run,
	// when that move has landed: not when it waits for the record, nor
	// when its write fails.
	pass := func(r *WorkloadLeaseReconciler, failing *bool, when, wantLease, wantRecord string) {
		t.Helper()
		if failing != nil {
			*failing = true
			defer func() { *failing = false }()
		}
		var leaseBefore string
		if f.c.Get(context.Background(), client.ObjectKey{Namespace: "ns", Name: "n"}, &fencerv1.Lease{}) == nil {
			leaseBefore, _ = f.selected(t)
		}
		if err := f.reconcile(t, r); (err != nil) != (failing != nil) {
			t.Fatalf("%s: the pass returned %v", when, err)
		}
		lease, record := f.selected(t)
		if lease != wantLease || record != wantRecord {
			t.Fatalf("%s: the Lease selects %q and the status records %q; want %q and %q", when, lease, record, wantLease, wantRecord)
		}
		wantEvents := 0
		if lease != leaseBefore && leaseBefore != "" && leaseBefore != "cj" { // "cj": created with no run, then pointed at one
			wantEvents = 1
		}
		// Job jN is named n-N; a deleted one is told by its UID.
		names := func(e string) bool {
			return strings.Contains(e, "Job n-"+strings.TrimPrefix(lease, "j")+",") || strings.Contains(e, "Job UID "+lease+" (not listed now")
		}
		got, warnings := f.takeovers()
		if len(got) != wantEvents || wantEvents == 1 && !names(got[0]) {
			t.Fatalf("%s: Takeover Events %q; want %d naming run %s", when, got, wantEvents, lease)
		}
		if len(warnings) > 0 { // nobody edited the Lease
			t.Fatalf("%s: Warnings %q", when, warnings)
		}
	}
	createJob := func(j *batchv1.Job) {
		t.Helper()
		if err := f.c.Create(context.Background(), j); err != nil {
			t.Fatal(err)
		}
	}
	deleteJob := func(name string) {
		t.Helper()
		if err := f.c.Delete(context.Background(), runJob(name, "", t0)); err != nil {
			t.Fatal(err)
		}
	}

	// The member Lease is created selecting no run: the record of its run
	// needs its UID. Its record fails: it stays so.
	a := &WorkloadLeaseReconciler{}
	pass(a, &f.failStatus, "created, the record of run j2 failed", "cj", "")
	pass(a, nil, "created", "j2", "j2")

	// A newer run; its record fails: the Lease does not move ahead of it.
	createJob(runJob("n-3", "j3", t0.Add(200*time.Second)))
	pass(a, &f.failStatus, "the record of run j3 failed", "j2", "j2")
	pass(a, nil, "run j3 recorded", "j3", "j3")

	// The manager is replaced; run j3's Job is deleted while its pods may
	// still run. The new manager keeps the Lease with them.
	deleteJob("n-3")
	b := &WorkloadLeaseReconciler{}
	pass(b, nil, "a new manager after run j3's Job was deleted", "j3", "j3")

	// A newer run is recorded but the Lease write fails, and that manager
	// goes too; then that run's Job is deleted. The next manager moves the
	// Lease on to the recorded run, never back.
	createJob(runJob("n-4", "j4", t0.Add(300*time.Second)))
	pass(b, &f.failLeaseUpdt, "run j4 recorded, its Lease write failed", "j3", "j4")
	deleteJob("n-4")
	c := &WorkloadLeaseReconciler{}
	pass(c, nil, "a new manager after run j4's Job was deleted", "j4", "j4")

	// A newer run, in the same pass as an edit of the WorkloadLease's TTL:
	// the move is a takeover all the same.
	createJob(runJob("n-5", "j5", t0.Add(400*time.Second)))
	var wl fencerv1.WorkloadLease
	if err := f.c.Get(context.Background(), client.ObjectKey{Namespace: "ns", Name: "wl"}, &wl); err != nil {
		t.Fatal(err)
	}
	wl.Spec.TTLSeconds, wl.Generation = 42, 2 // the fake sets no generation; the apiserver would
	if err := f.c.Update(context.Background(), &wl); err != nil {
		t.Fatal(err)
	}
	pass(c, nil, "run j5 and a TTL edit", "j5", "j5")

	// A hand edit of the Lease's selector into the shape of no run, the
	// one a new Lease is created with, is an edit: set back with a Warning.
	var l fencerv1.Lease
	if err := f.c.Get(context.Background(), client.ObjectKey{Namespace: "ns", Name: "n"}, &l); err != nil {
		t.Fatal(err)
	}
	l.Spec.HolderSelector, l.Generation = runSelector("cj"), 3
	if err := f.c.Update(context.Background(), &l); err != nil {
		t.Fatal(err)
	}
	if err := f.reconcile(t, c); err != nil {
		t.Fatal(err)
	}
	lease, _ := f.selected(t)
	if takeovers, warnings := f.takeovers(); lease != "j5" || len(takeovers) != 0 || len(warnings) != 1 || !strings.Contains(warnings[0], fencerv1.ReasonMemberLeaseReverted) {
		t.Fatalf("a hand edit into no run's selector: the Lease selects %q, Takeovers %q, Warnings %q; want j5, none, one MemberLeaseReverted", lease, takeovers, warnings)
	}

	// Run j5's Job is deleted, and then the member Lease by hand. The
	// Lease created again stays on run j5, never goes back to run j2, the
	// newest Job left: not when its first record fails, nor with a new
	// manager that knows the run only from the status.
	deleteJob("n-5")
	if err := f.c.Delete(context.Background(), &l); err != nil {
		t.Fatal(err)
	}
	pass(c, &f.failStatus, "the Lease deleted by hand and created again, its record failed", "cj", "j5")
	pass(&WorkloadLeaseReconciler{}, nil, "a new manager after the Lease was created again", "j5", "j5")
	if err := f.c.Get(context.Background(), client.ObjectKey{Namespace: "ns", Name: "n"}, &l); err != nil {
		t.Fatal(err)
	}
	if err := f.c.Delete(context.Background(), &l); err != nil {
		t.Fatal(err)
	}
	pass(c, nil, "the Lease deleted by hand again, created again in one pass", "j5", "j5")

	// The WorkloadLease moves to CronJob m, whose only run is older than
	// run j5: its member Lease m goes to m's run, not to n's run j5,
	// whose record is filed under the member name the WorkloadLease
	// names now.
	if err := f.c.Create(context.Background(), &batchv1.CronJob{ObjectMeta: metav1.ObjectMeta{Name: "m", Namespace: "ns", UID: "cj-m"}}); err != nil {
		t.Fatal(err)
	}
	jm := runJob("m-1", "jm1", t0.Add(50*time.Second))
	jm.OwnerReferences[0].Name, jm.OwnerReferences[0].UID = "m", "cj-m"
	createJob(jm)
	if err := f.c.Get(context.Background(), client.ObjectKey{Namespace: "ns", Name: "wl"}, &wl); err != nil {
		t.Fatal(err)
	}
	wl.Spec.Workload.Name, wl.Generation = "m", 3
	if err := f.c.Update(context.Background(), &wl); err != nil {
		t.Fatal(err)
	}
	for _, r := range []*WorkloadLeaseReconciler{c, {}} { // this manager, then a new one
		if err := f.reconcile(t, r); err != nil {
			t.Fatal(err)
		}
		var m fencerv1.Lease
		if err := f.c.Get(context.Background(), client.ObjectKey{Namespace: "ns", Name: "m"}, &m); err != nil {
			t.Fatal(err)
		}
		if got := m.Spec.HolderSelector.MatchLabels[jobControllerUID]; got != "jm1" {
			t.Fatalf("the WorkloadLease moved to CronJob m: Lease m selects run %q, want m's run jm1", got)
		}
	}

	// Run jm1's Job is deleted, an older run of m's left; the WorkloadLease
	// is set to a StatefulSet (none exists: Lease m is kept) and back, and
	// the manager replaced between: Lease m stays on run jm1.
	older := runJob("m-0", "jm0", t0.Add(10*time.Second))
	older.OwnerReferences[0].Name, older.OwnerReferences[0].UID = "m", "cj-m"
	createJob(older)
	deleteJob("m-1")
	setKind := func(kind fencerv1.WorkloadKind, gen int64) {
		t.Helper()
		if err := f.c.Get(context.Background(), client.ObjectKey{Namespace: "ns", Name: "wl"}, &wl); err != nil {
			t.Fatal(err)
		}
		wl.Spec.Workload.Kind, wl.Generation = kind, gen
		if err := f.c.Update(context.Background(), &wl); err != nil {
			t.Fatal(err)
		}
		if err := f.reconcile(t, &WorkloadLeaseReconciler{}); err != nil {
			t.Fatal(err)
		}
	}
	setKind(fencerv1.WorkloadStatefulSet, 4)
	setKind(fencerv1.WorkloadCronJob, 5)
	var m fencerv1.Lease
	if err := f.c.Get(context.Background(), client.ObjectKey{Namespace: "ns", Name: "m"}, &m); err != nil {
		t.Fatal(err)
	}
	if got := m.Spec.HolderSelector.MatchLabels[jobControllerUID]; got != "jm1" {
		t.Fatalf("the WorkloadLease set to a StatefulSet and back: Lease m selects run %q, want the deleted run jm1", got)
	}
}
