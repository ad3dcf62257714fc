package controllers

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
)

// Labels the workload controllers put on the pods of a member; a member
// Lease's selector matches them.
const (
	statefulSetPodName = "statefulset.kubernetes.io/pod-name"
	jobName            = "batch.kubernetes.io/job-name"
	jobControllerUID   = "batch.kubernetes.io/controller-uid"
	jobCompletionIndex = "batch.kubernetes.io/job-completion-index"
)

// member is one member's Lease as its WorkloadLease wants it: a name the
// member's pod can derive from what it knows, and a selector of that
// member's pods only.
type member struct {
	name     string
	selector metav1.LabelSelector
	// cronJob marks a CronJob's member. run names the run (Job) whose pods
	// the selector matches, if any; runUID is that Job's UID, and runOrder
	// orders it among the CronJob's runs. noRun is the selector of no run:
	// no pod's controller is the CronJob itself, whose UID is cronJobUID.
	cronJob               bool
	run, runUID, runOrder string
	cronJobUID            string
	noRun                 metav1.LabelSelector
}

// noMembers says why a workload has no members to lease: the condition's
// reason and message.
type noMembers struct{ reason, message string }

func (n *noMembers) Error() string { return n.message }

// members lists the members of wl's workload. A *noMembers error says why
// there are none (no such workload, a Job not Indexed); another is an API
// failure.
func members(ctx context.Context, c client.Reader, wl *fencerv1.WorkloadLease) ([]member, error) {
	key := client.ObjectKey{Namespace: wl.Namespace, Name: wl.Spec.Workload.Name}
	notFound := func(err error) error {
		if apierrors.IsNotFound(err) {
			return &noMembers{fencerv1.ReasonWorkloadNotFound, fmt.Sprintf("%s %s not found in namespace %s", wl.Spec.Workload.Kind, key.Name, key.Namespace)}
		}
		return err
	}
	switch wl.Spec.Workload.Kind {
	case fencerv1.WorkloadStatefulSet:
		var sts appsv1.StatefulSet
		if err := c.Get(ctx, key, &sts); err != nil {
			return nil, notFound(err)
		}
		return ordinals(&sts)
	case fencerv1.WorkloadJob:
		var job batchv1.Job
		if err := c.Get(ctx, key, &job); err != nil {
			return nil, notFound(err)
		}
		return indexes(&job)
	case fencerv1.WorkloadCronJob:
		var cj batchv1.CronJob
		if err := c.Get(ctx, key, &cj); err != nil {
			return nil, notFound(err)
		}
		return newestRun(ctx, c, &cj)
	}
	return nil, &noMembers{fencerv1.ReasonWorkloadNotFound, fmt.Sprintf("spec.workload.kind %q: want StatefulSet, Job or CronJob", wl.Spec.Workload.Kind)}
}

// ordinals are a StatefulSet's members: a Lease per ordinal, named as its
// pod, selecting the pod of that name among the StatefulSet's pods.
func ordinals(sts *appsv1.StatefulSet) ([]member, error) {
	// int64: start+replicas may overflow int32 (the API bounds neither).
	replicas, start := int64(1), int64(0)
	if sts.Spec.Replicas != nil {
		replicas = int64(*sts.Spec.Replicas)
	}
	if sts.Spec.Ordinals != nil {
		start = int64(sts.Spec.Ordinals.Start)
	}
	if err := tooMany("StatefulSet", sts.Name, "replicas", replicas); err != nil {
		return nil, err
	}
	out := make([]member, 0, max(replicas, 0))
	for i := start; i < start+replicas; i++ {
		name := sts.Name + "-" + strconv.FormatInt(i, 10)
		sel := metav1.LabelSelector{MatchLabels: map[string]string{statefulSetPodName: name}}
		if sts.Spec.Selector != nil {
			maps.Copy(sel.MatchLabels, sts.Spec.Selector.MatchLabels)
			sel.MatchExpressions = slices.Clone(sts.Spec.Selector.MatchExpressions)
		}
		sel.MatchLabels[statefulSetPodName] = name
		out = append(out, member{name: name, selector: sel})
	}
	return out, nil
}

// tooMany refuses a workload of more than MaxWorkloadMembers members
// before anything is allocated for them: the API bounds neither replicas
// nor completions, and a Lease per member of a huge workload would exhaust
// the manager's memory.
func tooMany(kind, name, field string, n int64) error {
	if n <= fencerv1.MaxWorkloadMembers {
		return nil
	}
	return &noMembers{fencerv1.ReasonTooManyMembers, fmt.Sprintf("%s %s has %s %d: a WorkloadLease leases at most %d members; the Leases of its members so far are kept",
		kind, name, field, n, fencerv1.MaxWorkloadMembers)}
}

// indexes are an Indexed Job's members: a Lease per completion index,
// named <job>-<index>, selecting that index's pods of every Job of that
// name: a Job re-created under it (kubectl replace --force) leaves pods
// that may still run, and its own index pods wait for them. A Job with a
// manual selector has no name label on its pods: its members select that
// index's pods by the Job's selector and its template's labels, which a Job
// re-created with the same ones shares in the same way.
func indexes(job *batchv1.Job) ([]member, error) {
	if job.Spec.CompletionMode == nil || *job.Spec.CompletionMode != batchv1.IndexedCompletion {
		return nil, &noMembers{fencerv1.ReasonNotIndexed, fmt.Sprintf("Job %s is not Indexed (spec.completionMode): its pods are not members to tell apart", job.Name)}
	}
	completions := int32(1)
	if job.Spec.Completions != nil {
		completions = *job.Spec.Completions
	}
	if err := tooMany("Job", job.Name, "completions", int64(completions)); err != nil {
		return nil, err
	}
	out := make([]member, 0, max(completions, 0))
	for i := range completions {
		idx := strconv.Itoa(int(i))
		sel := metav1.LabelSelector{MatchLabels: map[string]string{jobName: job.Name}}
		if manualSelector(job) {
			// The apiserver labels the pods of a Job with manualSelector
			// with nothing of its own: they carry the template's labels,
			// which its selector must match. Both together, so that a
			// broad selector (even an empty one, which the API accepts)
			// does not take in other Jobs' pods of the same index.
			sel = metav1.LabelSelector{MatchLabels: maps.Clone(job.Spec.Template.Labels), MatchExpressions: slices.Clone(job.Spec.Selector.MatchExpressions)}
			if sel.MatchLabels == nil {
				sel.MatchLabels = map[string]string{}
			}
			maps.Copy(sel.MatchLabels, job.Spec.Selector.MatchLabels)
		}
		sel.MatchLabels[jobCompletionIndex] = idx
		out = append(out, member{name: job.Name + "-" + idx, selector: sel})
	}
	return out, nil
}

// manualSelector: the Job's user chose its selector (spec.manualSelector),
// so its pods carry neither batch.kubernetes.io/job-name nor the Job's
// controller-uid, only the template's labels and the completion index.
func manualSelector(job *batchv1.Job) bool {
	return job.Spec.ManualSelector != nil && *job.Spec.ManualSelector && job.Spec.Selector != nil
}

// newestRun is a CronJob's one member: a Lease named as the CronJob that
// selects the pods of its newest Job (runOrder: the latest scheduled, or
// created, of two at once the greater name). A newer run takes the Lease
// over from an older one still running: the older run's pods leave the
// selector, and a holder no longer selected loses its tenure at once.
// Jobs are the CronJob's when it is their controller; with no Job yet,
// the selector matches no pod.
func newestRun(ctx context.Context, c client.Reader, cj *batchv1.CronJob) ([]member, error) {
	var jobs batchv1.JobList
	if err := c.List(ctx, &jobs, client.InNamespace(cj.Namespace)); err != nil {
		return nil, err
	}
	var newest *batchv1.Job
	order := ""
	for i := range jobs.Items {
		j := &jobs.Items[i]
		if ref := metav1.GetControllerOf(j); ref == nil || ref.UID != cj.UID {
			continue
		}
		if o := runOrder(j); newest == nil || o > order {
			newest, order = j, o
		}
	}
	// No pod carries a CronJob's UID as its controller's: the selector of
	// a CronJob with no run yet matches nothing.
	m := member{name: cj.Name, cronJob: true, cronJobUID: string(cj.UID), selector: runSelector(string(cj.UID)), noRun: runSelector(string(cj.UID))}
	if newest != nil {
		m.run, m.runUID, m.runOrder, m.selector = newest.Name, string(newest.UID), order, runSelector(string(newest.UID))
	}
	return []member{m}, nil
}

// runSelector selects the pods of the Job whose UID is uid.
func runSelector(uid string) metav1.LabelSelector {
	return metav1.LabelSelector{MatchLabels: map[string]string{jobControllerUID: uid}}
}

// cronJobScheduled is the annotation a CronJob's Jobs carry with the time
// they were scheduled for.
const cronJobScheduled = "batch.kubernetes.io/cronjob-scheduled-timestamp"

// runOrder orders a CronJob's Jobs as strings: the time the run is for,
// then the name. That time is the scheduled time the CronJob controller
// writes, but never later than the Job's creation, which the apiserver
// sets and no client can: a real run is created at or after its schedule
// (a late start keeps its earlier slot), while an annotation claiming a
// later time, which anyone who may create or edit a Job can write, would
// otherwise outrank every run created after it, and keep a member Lease on
// that Job after its deletion (cronJobRun). A Job made by hand, with no
// annotation, is ordered by its creation. WorkloadLeases record orders in
// their status (status.cronJobRun) and compare them with new ones as
// strings: a change of this format must still order the old ones.
func runOrder(j *batchv1.Job) string {
	at := j.CreationTimestamp.Time
	if t, err := time.Parse(time.RFC3339, j.Annotations[cronJobScheduled]); err == nil && t.Before(at) {
		at = t
	}
	return fmt.Sprintf("%020d/%s", at.Unix(), j.Name)
}
