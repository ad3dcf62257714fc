package controllers

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
)

// The member Leases' marks: the WorkloadLease they belong to, and its
// generation they were last written from. A member Lease that differs
// from its WorkloadLease at the generation it records was edited by
// someone else.
const (
	memberOfLabel              = "fencer.io/workloadlease"
	parentGenerationAnnotation = "fencer.io/workloadlease-generation"
)

// maxLeaseName is the longest Lease name (the pod annotation key's limit).
const maxLeaseName = 63

// appliedMembers is what applyMembers found: how many members have their
// Lease and how many of those are held, the members whose Lease name is
// another Lease's or too long, and those whose Lease is being deleted.
type appliedMembers struct {
	members, held int32
	taken         []string
	deleting      []string
}

// applyMembers creates or updates the Lease of each member in want, and
// deletes the WorkloadLease's Leases of members no longer there. A member
// whose Lease cannot be written (a quota on Leases, another admission
// policy, a conflict) does not hold up the others, nor the deletion of
// the members gone: its error is returned with theirs, after them.
func (r *WorkloadLeaseReconciler) applyMembers(ctx context.Context, wl *fencerv1.WorkloadLease, want []member, out *outcome) (appliedMembers, error) {
	var a appliedMembers
	var errs []error
	wanted := map[string]bool{}
	for _, m := range want {
		wanted[m.name] = true
		if err := r.applyMember(ctx, wl, m, &a, out); err != nil {
			errs = append(errs, err)
		}
	}
	errs = append(errs, r.deleteGone(ctx, wl, wanted))
	return a, errors.Join(errs...)
}

// applyMember creates, adopts or updates m's Lease, counting it in a.
func (r *WorkloadLeaseReconciler) applyMember(ctx context.Context, wl *fencerv1.WorkloadLease, m member, a *appliedMembers, out *outcome) error {
	if len(m.name) > maxLeaseName {
		a.taken = append(a.taken, m.name+" (over 63 characters)")
		return nil
	}
	var l fencerv1.Lease
	err := r.Get(ctx, client.ObjectKey{Namespace: wl.Namespace, Name: m.name}, &l)
	switch {
	case apierrors.IsNotFound(err):
		created, err := r.createMember(ctx, wl, m, out)
		if err != nil {
			return err
		}
		if created {
			a.members++
		} else { // a Lease the cache had not seen yet: look again
			a.taken = append(a.taken, m.name)
			out.result.RequeueAfter = time.Second
		}
		return nil
	case err != nil:
		return err
	case !metav1.IsControlledBy(&l, wl):
		adopted, err := r.adopt(ctx, wl, &l, out)
		if err != nil {
			return err
		}
		if !adopted {
			a.taken = append(a.taken, m.name)
			return nil
		}
	}
	if !l.DeletionTimestamp.IsZero() {
		// Its grant is released (or being released): not the member's
		// Lease any more. Its deletion ends in a Lease event, which brings
		// the WorkloadLease back here to create the member's new one.
		a.deleting = append(a.deleting, fmt.Sprintf("%s (waiting on %s)", l.Name, finalizerList(l.Finalizers)))
		return nil
	}
	a.members++
	if l.Status.OpenTenure() != nil {
		a.held++
	}
	return r.updateMember(ctx, wl, &l, m, out)
}

// adopt takes back l, a Lease of a member's name that no one controls and
// whose label still names wl: an edit dropped its controller reference
// (kubectl replace -f or edit of a manifest without ownerReferences), or
// wl was deleted with --cascade=orphan and created again. Left alone, the
// Lease would keep its edited selector, and the member's token would stay
// with whatever pod it selects, past the member's scale-down and wl's
// deletion. A Lease controlled by something else, or without the label, is
// someone else's: the name is taken. updateMember then sets its spec back.
func (r *WorkloadLeaseReconciler) adopt(ctx context.Context, wl *fencerv1.WorkloadLease, l *fencerv1.Lease, out *outcome) (bool, error) {
	if metav1.GetControllerOf(l) != nil || l.Labels[memberOfLabel] != wl.Name || !l.DeletionTimestamp.IsZero() {
		return false, nil
	}
	if err := controllerutil.SetControllerReference(wl, l, r.Scheme()); err != nil {
		return false, err
	}
	if err := r.Update(ctx, l); err != nil {
		return false, fmt.Errorf("adopting Lease %s: %w", l.Name, err)
	}
	out.event(corev1.EventTypeWarning, fencerv1.ReasonMemberLeaseReverted,
		"Lease %s had lost its controller reference to this WorkloadLease; adopted again, and its spec set back (edit the WorkloadLease instead)", l.Name)
	return true, nil
}

// memberSpec sets the fields of a member Lease that its WorkloadLease owns.
func memberSpec(spec *fencerv1.LeaseSpec, wl *fencerv1.WorkloadLease, m member) {
	spec.TTLSeconds = wl.Spec.TTLSeconds
	spec.Renewal = wl.Spec.Renewal
	spec.Policy = wl.Spec.Policy
	spec.BindIdentity = wl.Spec.BindIdentity
	spec.Suspend = wl.Spec.Suspend
	spec.TokenDelivery = wl.Spec.TokenDelivery
	spec.HolderSelector = *m.selector.DeepCopy()
	spec.SoleCandidate = true
}

// createMember creates m's Lease; false when a Lease of that name already
// exists.
func (r *WorkloadLeaseReconciler) createMember(ctx context.Context, wl *fencerv1.WorkloadLease, m member, out *outcome) (bool, error) {
	l := &fencerv1.Lease{ObjectMeta: metav1.ObjectMeta{
		Name: m.name, Namespace: wl.Namespace,
		Labels:      map[string]string{memberOfLabel: wl.Name},
		Annotations: map[string]string{parentGenerationAnnotation: strconv.FormatInt(wl.Generation, 10)},
	}}
	if m.cronJob {
		m = r.notBefore(wl, m)
	}
	memberSpec(&l.Spec, wl, m)
	toRun := m.cronJob && m.runUID != ""
	if toRun {
		// A CronJob's Lease selects a run only once the WorkloadLease's
		// status records it (afterRecord), and the record names the
		// Lease's UID, which it has only once created: it starts with no
		// run.
		l.Spec.HolderSelector = *m.noRun.DeepCopy()
	}
	if err := controllerutil.SetControllerReference(wl, l, r.Scheme()); err != nil {
		return false, err
	}
	switch err := r.Create(ctx, l); {
	case apierrors.IsAlreadyExists(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("creating Lease %s: %w", m.name, err)
	}
	if toRun {
		r.runs.propose(client.ObjectKeyFromObject(wl), l.Name, l.UID, selectedRun{m.runUID, m.runOrder, m.cronJobUID})
		r.afterRecord(wl, out, func(ctx context.Context) error { return r.selectRun(ctx, l, m.selector) })
	}
	return true, nil
}

// selectRun points the selector of l, a CronJob's member Lease just
// created, at its run. A merge patch: the Lease controller adds its
// finalizer to a new Lease meanwhile, which an update would conflict with.
func (r *WorkloadLeaseReconciler) selectRun(ctx context.Context, l *fencerv1.Lease, run metav1.LabelSelector) error {
	created := l.DeepCopy()
	l.Spec.HolderSelector = run
	if err := r.Patch(ctx, l, client.MergeFrom(created)); err != nil {
		return fmt.Errorf("pointing Lease %s at its run: %w", l.Name, err)
	}
	return nil
}

// owned lists the Leases of wl's namespace, to be filtered by their
// controller reference: not by the label memberOfLabel, which anyone who
// may edit a Lease can remove (a member Lease without it would outlive
// its member's scale-down).
func (r *WorkloadLeaseReconciler) owned(ctx context.Context, wl *fencerv1.WorkloadLease) (*fencerv1.LeaseList, error) {
	var all fencerv1.LeaseList
	if err := r.List(ctx, &all, client.InNamespace(wl.Namespace)); err != nil {
		return nil, err
	}
	return &all, nil
}

// keepMembers brings wl's Leases in line with its spec while its workload
// lists no members (missing, not Indexed, too large), and returns how many
// are held. Their pods may still run (a StatefulSet deleted with
// --cascade=orphan), so each Lease is kept, with its selector, which only
// the workload can give anew; but every other field the WorkloadLease owns
// follows it: spec.suspend set while the StatefulSet is away suspends its
// members, and an edit of a member's TTL is set back.
func (r *WorkloadLeaseReconciler) keepMembers(ctx context.Context, wl *fencerv1.WorkloadLease, out *outcome) (int32, error) {
	owned, err := r.owned(ctx, wl)
	if err != nil {
		return 0, err
	}
	var held int32
	for i := range owned.Items {
		l := &owned.Items[i]
		if !metav1.IsControlledBy(l, wl) {
			continue
		}
		if l.Status.OpenTenure() != nil {
			held++
		}
		// Not a CronJob's run (cronJob false): the run memory stays as it is.
		kept := member{name: l.Name, selector: l.Spec.HolderSelector}
		if err := r.updateMember(ctx, wl, l, kept, out); err != nil {
			return held, err
		}
	}
	return held, nil
}

// updateMember sets a member Lease's owned fields back to what its
// WorkloadLease says. Changed at the generation it records, it was edited:
// a Warning says so. A CronJob's Lease moving to a newer run is the
// takeover, a Normal Event; it moves only once the WorkloadLease's status
// records that run (afterRecord).
func (r *WorkloadLeaseReconciler) updateMember(ctx context.Context, wl *fencerv1.WorkloadLease, l *fencerv1.Lease, m member, out *outcome) error {
	gen := strconv.FormatInt(wl.Generation, 10)
	recorded := true
	if m.cronJob {
		m, recorded = r.cronJobRun(wl, l, m)
	}
	spec := l.Spec.DeepCopy()
	memberSpec(spec, wl, m)
	if equality.Semantic.DeepEqual(*spec, l.Spec) && l.Annotations[parentGenerationAnnotation] == gen && l.Labels[memberOfLabel] == wl.Name {
		if !recorded {
			// Selected already, by a manager whose record did not land:
			// recorded now.
			r.afterRecord(wl, out, nil)
		}
		return nil
	}
	sameGeneration := l.Annotations[parentGenerationAnnotation] == gen
	otherwise := spec.DeepCopy()
	otherwise.HolderSelector = l.Spec.HolderSelector
	otherFields := !equality.Semantic.DeepEqual(*otherwise, l.Spec)
	selectorMoved := !equality.Semantic.DeepEqual(spec.HolderSelector, l.Spec.HolderSelector)
	takeover := selectorMoved && fromRun(l.Spec.HolderSelector, m)
	// A CronJob's Lease created with no run whose pointing at its run
	// failed is pointed now: no edit to report. Generation 1: its spec was
	// never written since its creation (an edit into that selector bumps it).
	firstRun := selectorMoved && m.cronJob && m.runUID != "" && l.Generation <= 1 && equality.Semantic.DeepEqual(l.Spec.HolderSelector, m.noRun)
	if sameGeneration && (otherFields || selectorMoved && !takeover && !firstRun) {
		out.event(corev1.EventTypeWarning, fencerv1.ReasonMemberLeaseReverted, "Lease %s's spec was edited; set back: this WorkloadLease owns it (edit the WorkloadLease instead)", l.Name)
	}
	l.Spec = *spec
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	l.Annotations[parentGenerationAnnotation] = gen
	if l.Labels == nil {
		l.Labels = map[string]string{}
	}
	l.Labels[memberOfLabel] = wl.Name
	var moved string
	if takeover {
		moved = m.run
		if moved == "" {
			moved = fmt.Sprintf("UID %s (not listed now: deleted, or not yet seen; its pods may still run)", m.runUID)
		}
	}
	write := func(ctx context.Context) error { return r.writeMember(ctx, wl, l, moved) }
	if !recorded {
		r.afterRecord(wl, out, write)
		return nil
	}
	return write(ctx)
}

// writeMember writes member Lease l. A takeover, l moved from one of the
// CronJob's runs to the Job named by moved, is told by a Normal Event once
// the write has landed, not with the pass's Events: the move may wait for
// the status write (afterRecord), or fail and be tried again, and the
// Event says it happened, once.
func (r *WorkloadLeaseReconciler) writeMember(ctx context.Context, wl *fencerv1.WorkloadLease, l *fencerv1.Lease, moved string) error {
	if err := r.Update(ctx, l); err != nil {
		return fmt.Errorf("updating Lease %s: %w", l.Name, err)
	}
	if moved != "" {
		r.Recorder.Eventf(wl, nil, corev1.EventTypeNormal, fencerv1.ReasonTakeover, fencerv1.ReasonTakeover,
			"Lease %s now selects the pods of Job %s, the CronJob's newest run", l.Name, moved)
	}
	return nil
}

// notBefore is m, or the run recorded for the Lease of m's name before
// this one when that run is newer: a member Lease deleted (by hand) while
// its run's Job is gone is created again on that run, never on an older
// one, and moves to it only once the status records it for the new Lease.
func (r *WorkloadLeaseReconciler) notBefore(wl *fencerv1.WorkloadLease, m member) member {
	before, ok := r.runs.recordedBefore(client.ObjectKeyFromObject(wl), m.name)
	// The record is filed under the name the WorkloadLease names now: one
	// of another CronJob (the WorkloadLease moved to another CronJob, or
	// the CronJob was created again), or of unknown CronJob, is no floor.
	if !ok || before.cronJob == "" || before.cronJob != m.cronJobUID || before.uid == m.runUID || before.order <= m.runOrder {
		return m
	}
	return m.onRun(before)
}

// onRun is m, a CronJob's member, selecting recorded run instead: one
// whose Job is not listed now, so its name is not known.
func (m member) onRun(run selectedRun) member {
	return member{name: m.name, cronJob: true, cronJobUID: run.cronJob, runUID: run.uid, runOrder: run.order, selector: runSelector(run.uid), noRun: m.noRun}
}

// fromRun tells whether selector, a CronJob member Lease's, is the
// selector of a run other than m's: not the selector of no run a Lease is
// created with, nor one edited by hand into any other shape, which is set
// back with a Warning. (An edit to another run's selector reads as a run
// and is set back with a Takeover: only the shape tells them apart.)
func fromRun(selector metav1.LabelSelector, m member) bool {
	uid := selector.MatchLabels[jobControllerUID]
	return m.cronJob && m.runUID != "" && uid != "" && uid != m.runUID &&
		equality.Semantic.DeepEqual(selector, runSelector(uid)) && !equality.Semantic.DeepEqual(selector, m.noRun)
}

// afterRecord has the runs proposed in this pass over wl noted as
// recorded once its status is written, and then runs move, if any: a
// CronJob's Lease moves to a run only once the status records it, so that
// a manager that starts after it (recall) never finds the Lease on a run
// newer than the record, and moves it back.
func (r *WorkloadLeaseReconciler) afterRecord(wl *fencerv1.WorkloadLease, out *outcome, move func(context.Context) error) {
	key := client.ObjectKeyFromObject(wl)
	before := out.afterStatus
	out.afterStatus = func(ctx context.Context) error {
		if before != nil {
			if err := before(ctx); err != nil {
				return err
			}
		}
		r.runs.written(key)
		if move == nil {
			return nil
		}
		return move(ctx)
	}
}

// deleteGone deletes the WorkloadLease's Leases whose members are gone:
// the StatefulSet scaled down, the Job's completions lowered, another
// workload named. Each delete names the Lease's UID: the cache may still
// show a member Lease that was deleted since, and a Lease of that name
// created meanwhile, perhaps another's, is not this one to delete (the
// apiserver refuses with a conflict, and that Lease's creation wakes the
// WorkloadLease again).
func (r *WorkloadLeaseReconciler) deleteGone(ctx context.Context, wl *fencerv1.WorkloadLease, wanted map[string]bool) error {
	owned, err := r.owned(ctx, wl)
	if err != nil {
		return err
	}
	for i := range owned.Items {
		l := &owned.Items[i]
		if wanted[l.Name] || !metav1.IsControlledBy(l, wl) {
			continue
		}
		err := r.Delete(ctx, l, client.Preconditions{UID: &l.UID})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return fmt.Errorf("deleting Lease %s: %w", l.Name, err)
		}
	}
	r.runs.keepOnly(client.ObjectKeyFromObject(wl), wanted)
	return nil
}

// cronJobRun is the run a CronJob's member Lease selects: m, the newest
// Job left, unless the run recorded for the Lease (or, none recorded for
// it, for the Lease of its name before it: notBefore) is newer than m. Then
// that run's Job was deleted (a history limit, a user) and its pods may
// still run, so the Lease stays with them, never back to an older run; its
// selector is rebuilt from the run's Job UID, so an edit of the selector is
// set back then too. The run is read from the WorkloadLease's status as
// this process recorded or recalled it (selectedRuns), never from the
// Lease, whose annotations and selector any Lease editor can write.
// recorded is false for a run the status does not record yet: it is
// proposed, and the Lease may move to it only once the status is written.
func (r *WorkloadLeaseReconciler) cronJobRun(wl *fencerv1.WorkloadLease, l *fencerv1.Lease, m member) (_ member, recorded bool) {
	key := client.ObjectKeyFromObject(wl)
	last, ok := r.runs.recorded(key, l.Name, l.UID)
	if !ok {
		m = r.notBefore(wl, m)
	}
	switch {
	case ok && last.uid != m.runUID && last.order > m.runOrder:
		return m.onRun(last), true
	case m.runUID == "" || ok && last.uid == m.runUID && last.cronJob != "":
		return m, true
	}
	// A newer run, or the run recorded by a fencer that did not record
	// the CronJob's UID: recorded again, with it.
	r.runs.propose(key, l.Name, l.UID, selectedRun{m.runUID, m.runOrder, m.cronJobUID})
	return m, false
}
