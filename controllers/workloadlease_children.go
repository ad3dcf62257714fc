package controllers

import (
	"context"
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
	// runAnnotation orders the CronJob run a member Lease selects
	// (runOrder), so that it never moves back to an older one when the
	// newer run's Job is deleted.
	runAnnotation = "fencer.io/workloadlease-run"
	// runUIDAnnotation is the UID of that run's Job: its selector, when
	// the Job is deleted and the Lease stays with its pods.
	runUIDAnnotation = "fencer.io/workloadlease-run-uid"
	// runClockSkew is how far past the manager's clock a run's scheduled
	// time may be: the apiserver's and the CronJob controller's clocks
	// differ from it a little.
	runClockSkew = 5 * time.Minute
)

// maxLeaseName is the longest Lease name (the pod annotation key's limit).
const maxLeaseName = 63

// appliedMembers is what applyMembers found: how many members have their
// Lease and how many of those are held, and the members whose Lease name
// is another Lease's or too long.
type appliedMembers struct {
	members, held int32
	taken         []string
}

// applyMembers creates or updates the Lease of each member in want, and
// deletes the WorkloadLease's Leases of members no longer there.
func (r *WorkloadLeaseReconciler) applyMembers(ctx context.Context, wl *fencerv1.WorkloadLease, want []member, out *outcome) (appliedMembers, error) {
	var a appliedMembers
	wanted := map[string]bool{}
	for _, m := range want {
		wanted[m.name] = true
		if len(m.name) > maxLeaseName {
			a.taken = append(a.taken, m.name+" (over 63 characters)")
			continue
		}
		var l fencerv1.Lease
		err := r.Get(ctx, client.ObjectKey{Namespace: wl.Namespace, Name: m.name}, &l)
		switch {
		case apierrors.IsNotFound(err):
			created, err := r.createMember(ctx, wl, m)
			if err != nil {
				return a, err
			}
			if created {
				a.members++
			} else { // a Lease the cache had not seen yet: look again
				a.taken = append(a.taken, m.name)
				out.result.RequeueAfter = time.Second
			}
			continue
		case err != nil:
			return a, err
		case !metav1.IsControlledBy(&l, wl):
			a.taken = append(a.taken, m.name)
			continue
		}
		a.members++
		if l.Status.OpenTenure() != nil {
			a.held++
		}
		if err := r.updateMember(ctx, wl, &l, m, out); err != nil {
			return a, err
		}
	}
	return a, r.deleteGone(ctx, wl, wanted)
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
func (r *WorkloadLeaseReconciler) createMember(ctx context.Context, wl *fencerv1.WorkloadLease, m member) (bool, error) {
	l := &fencerv1.Lease{ObjectMeta: metav1.ObjectMeta{
		Name: m.name, Namespace: wl.Namespace,
		Labels:      map[string]string{memberOfLabel: wl.Name},
		Annotations: map[string]string{parentGenerationAnnotation: strconv.FormatInt(wl.Generation, 10)},
	}}
	if m.run != "" {
		l.Annotations[runAnnotation] = m.runOrder
		l.Annotations[runUIDAnnotation] = m.runUID
	}
	memberSpec(&l.Spec, wl, m)
	if err := controllerutil.SetControllerReference(wl, l, r.Scheme()); err != nil {
		return false, err
	}
	switch err := r.Create(ctx, l); {
	case apierrors.IsAlreadyExists(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("creating Lease %s: %w", m.name, err)
	}
	return true, nil
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

// countHeld is how many of wl's Leases are held.
func (r *WorkloadLeaseReconciler) countHeld(ctx context.Context, wl *fencerv1.WorkloadLease) (int32, error) {
	owned, err := r.owned(ctx, wl)
	if err != nil {
		return 0, err
	}
	var held int32
	for i := range owned.Items {
		if metav1.IsControlledBy(&owned.Items[i], wl) && owned.Items[i].Status.OpenTenure() != nil {
			held++
		}
	}
	return held, nil
}

// updateMember sets a member Lease's owned fields back to what its
// WorkloadLease says. Changed at the generation it records, it was edited:
// a Warning says so. A CronJob's Lease moving to a newer run is the
// takeover, a Normal Event.
func (r *WorkloadLeaseReconciler) updateMember(ctx context.Context, wl *fencerv1.WorkloadLease, l *fencerv1.Lease, m member, out *outcome) error {
	gen := strconv.FormatInt(wl.Generation, 10)
	if cur := l.Annotations[runAnnotation]; m.run != "" && cur > m.runOrder {
		stay, corrected, ok := r.stayOnDeletedRun(l, m)
		switch {
		case !ok:
			out.event(corev1.EventTypeWarning, fencerv1.ReasonMemberLeaseReverted,
				"Lease %s records run %q but no Job UID for it (annotation %s), and no tenure of it is open; set back to the newest run, Job %s",
				l.Name, cur, runUIDAnnotation, m.run)
		case corrected:
			out.event(corev1.EventTypeWarning, fencerv1.ReasonMemberLeaseReverted,
				"Lease %s's annotation %s was %q, which no run of the CronJob can have yet; set to %q, when its holder's tenure began",
				l.Name, runAnnotation, cur, stay.runOrder)
		}
		if ok {
			m = stay
		}
	}
	spec := l.Spec.DeepCopy()
	memberSpec(spec, wl, m)
	if equality.Semantic.DeepEqual(*spec, l.Spec) && l.Annotations[parentGenerationAnnotation] == gen && l.Annotations[runAnnotation] == m.runOrder &&
		l.Annotations[runUIDAnnotation] == m.runUID && l.Labels[memberOfLabel] == wl.Name {
		return nil
	}
	sameGeneration := l.Annotations[parentGenerationAnnotation] == gen
	otherwise := spec.DeepCopy()
	otherwise.HolderSelector = l.Spec.HolderSelector
	selectorOnly := equality.Semantic.DeepEqual(*otherwise, l.Spec) && !equality.Semantic.DeepEqual(spec.HolderSelector, l.Spec.HolderSelector)
	switch {
	case selectorOnly && m.run != "":
		out.event(corev1.EventTypeNormal, fencerv1.ReasonTakeover, "Lease %s now selects the pods of Job %s: the newer run takes over", l.Name, m.run)
	case sameGeneration && !equality.Semantic.DeepEqual(*spec, l.Spec):
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
	if m.runOrder != "" {
		l.Annotations[runAnnotation] = m.runOrder
		l.Annotations[runUIDAnnotation] = m.runUID
	}
	if err := r.Update(ctx, l); err != nil {
		return fmt.Errorf("updating Lease %s: %w", l.Name, err)
	}
	return nil
}

// deleteGone deletes the WorkloadLease's Leases whose members are gone:
// the StatefulSet scaled down, the Job's completions lowered, another
// workload named.
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
		if err := r.Delete(ctx, l); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("deleting Lease %s: %w", l.Name, err)
		}
	}
	return nil
}

// stayOnDeletedRun is m as the Lease keeps it when the run it selects is
// newer than the newest Job left (m's): that Job was deleted, and its pods
// may still run, so the Lease stays with them, never back to an older run.
// The selector is rebuilt from the run's Job UID, as recorded, so an edit
// of the selector meanwhile is set back as at any other time.
//
// A recorded order no run can have yet (scheduled after now, or no order
// at all) is not believed: kept, it would hold the Lease on its run against
// every newer one. It is set to when the open tenure began (corrected),
// which the status records and only the manager writes: the run was there
// by then, and every run scheduled later takes over. ok is false when
// there is no run to stay on: no Job UID recorded, or a bad order and no
// open tenure.
func (r *WorkloadLeaseReconciler) stayOnDeletedRun(l *fencerv1.Lease, m member) (stay member, corrected, ok bool) {
	order, uid := l.Annotations[runAnnotation], l.Annotations[runUIDAnnotation]
	if uid == "" { // written before the UID was recorded: the selector names it
		uid = l.Spec.HolderSelector.MatchLabels[jobControllerUID]
	}
	if uid == "" {
		return m, false, false
	}
	if at, parsed := runTime(order); !parsed || at.After(r.now().Add(runClockSkew)) {
		t := l.Status.OpenTenure()
		if t == nil {
			return m, false, false
		}
		order, corrected = fmt.Sprintf("%020d/", t.Start.Unix()), true
	}
	return member{name: m.name, selector: runSelector(uid), runOrder: order, runUID: uid}, corrected, true
}

func (r *WorkloadLeaseReconciler) now() time.Time {
	if r.Clock == nil {
		return time.Now()
	}
	return r.Clock.Now()
}
