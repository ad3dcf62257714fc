package controllers

import (
	"context"
	"errors"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
)

// WorkloadLeaseReconciler keeps a Lease for each member of a WorkloadLease's
// workload: it creates them, reverts edits of the fields it owns, deletes
// those of members that are gone, and moves a CronJob's Lease to its
// newest run. The Lease controller grants them like any other.
type WorkloadLeaseReconciler struct {
	client.Client
	Recorder events.EventRecorder
	Clock    clock.Clock
	// APIReader confirms, uncached, what the cache may be behind on.
	APIReader client.Reader

	// runs are the CronJob runs recorded per member Lease.
	runs selectedRuns
	// stale tells a copy the cache may be behind on.
	stale staleCopies
}

// leadership is the term of a WorkloadLeaseReconciler's staleCopies: it
// runs only while its process leads, and a process leads once (it exits
// when it loses leadership).
const leadership = "this process"

// +kubebuilder:rbac:groups=fencer.io,resources=workloadleases,verbs=get;list;watch
// +kubebuilder:rbac:groups=fencer.io,resources=workloadleases/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=fencer.io,resources=workloadleases/finalizers,verbs=update
// +kubebuilder:rbac:groups=fencer.io,resources=leases,verbs=create;delete
// +kubebuilder:rbac:groups=apps,resources=statefulsets,verbs=get;list;watch
// +kubebuilder:rbac:groups=batch,resources=jobs;cronjobs,verbs=get;list;watch

// Reconcile brings one WorkloadLease's member Leases in line with its
// workload and writes its status once.
func (r *WorkloadLeaseReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	wl := &fencerv1.WorkloadLease{}
	if err := r.Get(ctx, req.NamespacedName, wl); err != nil {
		if apierrors.IsNotFound(err) {
			r.runs.forgetAll(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !wl.DeletionTimestamp.IsZero() {
		r.runs.forgetAll(req.NamespacedName)
		return ctrl.Result{}, nil // the garbage collector deletes its Leases
	}
	if behind, err := r.behind(ctx, wl); err != nil {
		return ctrl.Result{}, err
	} else if behind {
		return ctrl.Result{RequeueAfter: staleRetry}, nil
	}
	ctx = ctrl.LoggerInto(ctx, ctrl.LoggerFrom(ctx).WithValues("workloadlease", req.NamespacedName))
	before := wl.Status.DeepCopy()
	r.runs.startPass(ctx, wl, r.Clock.Now())
	out, err := r.reconcileMembers(ctx, wl)
	if err != nil {
		return ctrl.Result{}, err
	}
	if wl.Spec.Workload.Kind == fencerv1.WorkloadCronJob {
		wl.Status.CronJobRun = r.runs.record(wl)
	}
	// Otherwise the record stays: a WorkloadLease set to another kind and
	// back (its Lease kept meanwhile, or deleted and created again) finds
	// the run its Lease stays with, even after a manager restart.
	return finish(ctx, apiClientOf(r.Client, r.APIReader), r.Recorder, wl, before, &wl.Status, out)
}

// behind reports whether the cache's copy of wl, or of its workload, may
// be older than the API's (staleCopies). An older record of the run a
// CronJob's Lease follows would move the Lease back to an older run; an
// older StatefulSet or Job would delete the Leases of members the last
// leader saw added, and their holders' grants with them.
func (r *WorkloadLeaseReconciler) behind(ctx context.Context, wl *fencerv1.WorkloadLease) (bool, error) {
	if behind, err := r.stale.behind(ctx, r.APIReader, &fencerv1.WorkloadLeaseList{}, wl, leadership); err != nil || behind {
		return behind, err
	}
	var workload client.Object
	switch wl.Spec.Workload.Kind {
	case fencerv1.WorkloadStatefulSet:
		workload = &appsv1.StatefulSet{}
	case fencerv1.WorkloadJob:
		workload = &batchv1.Job{}
	case fencerv1.WorkloadCronJob:
		workload = &batchv1.CronJob{}
	default:
		return false, nil
	}
	if err := r.Get(ctx, client.ObjectKey{Namespace: wl.Namespace, Name: wl.Spec.Workload.Name}, workload); err != nil {
		// None in the cache: its members keep their Leases (noMembers).
		return false, client.IgnoreNotFound(err)
	}
	// Compared by reading it, not by resourceVersion: the apiserver may
	// keep apps and batch in another etcd than fencer's kinds.
	return r.stale.behind(ctx, r.APIReader, nil, workload, leadership)
}

// reconcileMembers applies the member Leases and sets the status.
func (r *WorkloadLeaseReconciler) reconcileMembers(ctx context.Context, wl *fencerv1.WorkloadLease) (outcome, error) {
	var out outcome
	wl.Status.ObservedGeneration = wl.Generation
	want, err := members(ctx, r.Client, wl)
	var none *noMembers
	if errors.As(err, &none) {
		// The workload is gone, or not yet there, or re-created under its
		// name (kubectl replace --force): its pods may still run, so its
		// members keep their Leases, and those still follow the rest of
		// the spec; the condition says why.
		var held int32
		if held, err = r.keepMembers(ctx, wl, &out); err != nil {
			return out, err
		}
		wl.Status.Held = held
		setWorkloadReady(wl, metav1.ConditionFalse, none.reason, none.message)
		return out, nil
	}
	if err != nil {
		return out, err
	}
	applied, err := r.applyMembers(ctx, wl, want, &out)
	if err != nil {
		return out, err
	}
	wl.Status.Members, wl.Status.Held = applied.members, applied.held
	switch {
	case len(applied.taken) > 0:
		msg := fmt.Sprintf("Leases %v exist and are not this WorkloadLease's: those members have no Lease of their own; rename or delete them", applied.taken)
		setWorkloadReady(wl, metav1.ConditionFalse, fencerv1.ReasonNameTaken, msg)
		out.event(corev1.EventTypeWarning, fencerv1.ReasonNameTaken, "%s", msg)
	case len(applied.deleting) > 0:
		setWorkloadReady(wl, metav1.ConditionFalse, fencerv1.ReasonMemberLeaseDeleting, fmt.Sprintf(
			"the Leases %v of members are being deleted, and their grants released: each member gets a new Lease once its old one is gone", applied.deleting))
	default:
		setWorkloadReady(wl, metav1.ConditionTrue, fencerv1.ReasonMembersLeased, fmt.Sprintf("%d members of %s %s have their Lease", len(want), wl.Spec.Workload.Kind, wl.Spec.Workload.Name))
	}
	return out, nil
}

func setWorkloadReady(wl *fencerv1.WorkloadLease, status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&wl.Status.Conditions, metav1.Condition{
		Type: fencerv1.ConditionReady, Status: status, Reason: reason, Message: msg, ObservedGeneration: wl.Generation,
	})
}

// indexWorkload holds "<kind>/<name>" of a WorkloadLease's workload, so
// that a StatefulSet, Job or CronJob event finds its WorkloadLeases.
const indexWorkload = "fencer.io/workload"

func workloadValues(obj client.Object) []string {
	if wl, ok := obj.(*fencerv1.WorkloadLease); ok {
		return []string{string(wl.Spec.Workload.Kind) + "/" + wl.Spec.Workload.Name}
	}
	return nil
}

// SetupWithManager reconciles a WorkloadLease when it, one of its Leases,
// or its workload changes; a Job also wakes its CronJob's WorkloadLeases.
func (r *WorkloadLeaseReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&fencerv1.WorkloadLease{}, builder.WithPredicates(notStatusOnly)).
		Owns(&fencerv1.Lease{}).
		// A Lease of another's taking a member's name, or freeing it.
		Watches(&fencerv1.Lease{}, handler.EnqueueRequestsFromMapFunc(r.inNamespace), builder.WithPredicates(createOrDelete)).
		Watches(&appsv1.StatefulSet{}, handler.EnqueueRequestsFromMapFunc(r.forWorkload(fencerv1.WorkloadStatefulSet))).
		Watches(&batchv1.Job{}, handler.EnqueueRequestsFromMapFunc(r.forJob)).
		Watches(&batchv1.CronJob{}, handler.EnqueueRequestsFromMapFunc(r.forWorkload(fencerv1.WorkloadCronJob))).
		Named("workloadlease").
		Complete(r)
}

// forWorkload maps a workload of kind to the WorkloadLeases naming it.
func (r *WorkloadLeaseReconciler) forWorkload(kind fencerv1.WorkloadKind) handler.MapFunc {
	return func(ctx context.Context, obj client.Object) []reconcile.Request {
		return r.naming(ctx, obj.GetNamespace(), kind, obj.GetName())
	}
}

// forJob maps a Job to the WorkloadLeases naming it, and those naming the
// CronJob that controls it.
func (r *WorkloadLeaseReconciler) forJob(ctx context.Context, obj client.Object) []reconcile.Request {
	reqs := r.naming(ctx, obj.GetNamespace(), fencerv1.WorkloadJob, obj.GetName())
	if ref := metav1.GetControllerOf(obj); ref != nil && ref.Kind == "CronJob" {
		reqs = append(reqs, r.naming(ctx, obj.GetNamespace(), fencerv1.WorkloadCronJob, ref.Name)...)
	}
	return reqs
}

// inNamespace maps an object to every WorkloadLease of its namespace.
func (r *WorkloadLeaseReconciler) inNamespace(ctx context.Context, obj client.Object) []reconcile.Request {
	return r.requests(ctx, client.InNamespace(obj.GetNamespace()))
}

// createOrDelete passes only creations and deletions.
var createOrDelete = predicate.Funcs{
	UpdateFunc:  func(event.UpdateEvent) bool { return false },
	GenericFunc: func(event.GenericEvent) bool { return false },
}

func (r *WorkloadLeaseReconciler) naming(ctx context.Context, namespace string, kind fencerv1.WorkloadKind, name string) []reconcile.Request {
	return r.requests(ctx, client.InNamespace(namespace), client.MatchingFields{indexWorkload: string(kind) + "/" + name})
}

// requests lists the WorkloadLeases opts select, as requests to reconcile.
func (r *WorkloadLeaseReconciler) requests(ctx context.Context, opts ...client.ListOption) []reconcile.Request {
	var wls fencerv1.WorkloadLeaseList
	if err := r.List(ctx, &wls, opts...); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "listing WorkloadLeases")
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(wls.Items))
	for _, wl := range wls.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&wl)})
	}
	return reqs
}
