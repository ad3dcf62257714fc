package controllers

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/internal/etcdstore"
	"github.com/fencer-io/fencer/internal/metrics"
	"github.com/fencer-io/fencer/internal/renew"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
)

const (
	// repairInterval is how often a range is compared with etcd even when
	// nothing changes, to fix drift.
	repairInterval = 30 * time.Second
)

// IDRangeReconciler hands out ID blocks and leased worker-ID slots.
type IDRangeReconciler struct {
	client.Client
	Store    *etcdstore.Store
	Elector  *etcdstore.Elector
	Renewer  *renew.Renewer
	Recorder events.EventRecorder
	Clock    clock.Clock
	// APIReader confirms, uncached, what the cache may be behind on.
	APIReader client.Reader
	wake      waker[fencerv1.IDRange, *fencerv1.IDRange]
	handed    handedBlocks
	own       ownBlocks
	names     rangeNames
	// stale tells a copy of an IDRange the cache may be behind on.
	stale staleCopies
}

// NewIDRangeReconciler wires a reconciler; a lost slot keepalive wakes it.
func NewIDRangeReconciler(c client.Client, store *etcdstore.Store, elector *etcdstore.Elector, rec events.EventRecorder, clk clock.Clock) *IDRangeReconciler {
	r := &IDRangeReconciler{Client: c, Store: store, Elector: elector, Recorder: rec, Clock: clk, wake: newWaker[fencerv1.IDRange]()}
	r.Renewer = renewerWaking(store, clk, r.wake, func(key string) (string, string, bool) {
		ns, name, _, ok := etcdkeys.ParseSlotKey(store.Prefix(), key)
		return ns, name, ok
	})
	return r
}

// +kubebuilder:rbac:groups=fencer.io,resources=idranges,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=fencer.io,resources=idranges/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=fencer.io,resources=idranges/finalizers,verbs=update
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;patch

// Reconcile allocates for one IDRange and writes its status once.
func (r *IDRangeReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	rng := &fencerv1.IDRange{}
	if err := r.Get(ctx, req.NamespacedName, rng); apierrors.IsNotFound(err) {
		return ctrl.Result{}, r.forgetGone(ctx)
	} else if err != nil {
		return ctrl.Result{}, err
	}
	if old := r.names.replaced(req.NamespacedName, rng.UID); old != "" {
		r.forget(old)
	}
	ctx = ctrl.LoggerInto(ctx, ctrl.LoggerFrom(ctx).WithValues("idrange", req.NamespacedName))
	return runPass(ctx, apiClientOf(r.Client, r.APIReader), r.Recorder, rng, fencerv1.IDRangeFinalizer,
		func(ctx context.Context) (ctrl.Result, error) { return r.finalize(ctx, rng) },
		func(ctx context.Context) (outcome, error) { return r.reconcileRange(ctx, rng) })
}

// cacheBehind, asked before a pass releases or leases a slot, reports
// whether the cache's copy of rng may be older than the API's
// (staleCopies), and then has the pass write nothing and run again soon.
// A max the last leader saw raised covers slots it leased above the older
// one: released as out of range, they would be freed while their
// generators run. Renewing the slots pods hold never waits.
func (r *IDRangeReconciler) cacheBehind(ctx context.Context, rng *fencerv1.IDRange, out *outcome) bool {
	if out.cacheBehind {
		return true // one look a pass
	}
	behind, err := r.stale.behindInTerm(ctx, r.Elector, r.APIReader, &fencerv1.IDRangeList{}, rng)
	if err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "reading the IDRange from the apiserver, to tell whether the cache is behind")
	}
	if behind || err != nil {
		out.cacheBehind = true
		out.result.RequeueAfter = staleRetry
		return true
	}
	return false
}

// forgetGone drops what this process remembers of the blocks of IDRanges
// the cache no longer has. The finalize forgets the range it releases, but
// a range finalized while this manager stood by (another had the term), or
// whose finalizer was removed by hand, never passes there on this one. A
// range created in the moment between the list and the sweep may lose its
// memory too, which costs it one etcd read per pod, or one skipped block,
// as a manager restart does.
func (r *IDRangeReconciler) forgetGone(ctx context.Context) error {
	var ranges fencerv1.IDRangeList
	if err := r.List(ctx, &ranges); err != nil {
		return err
	}
	live := make(map[types.UID]bool, len(ranges.Items))
	for i := range ranges.Items {
		live[ranges.Items[i].UID] = true
	}
	isLive := func(rng types.UID) bool { return live[rng] }
	r.handed.keepRanges(isLive)
	r.own.keepRanges(isLive)
	r.names.keepRanges(isLive)
	return nil
}

// forget drops what this process remembers of the blocks of range rng.
func (r *IDRangeReconciler) forget(rng types.UID) {
	r.handed.forget(rng)
	r.own.forget(rng)
}

// reconcileRange hands out blocks or slots to the IDRange's pods and sets
// its status to match.
func (r *IDRangeReconciler) reconcileRange(ctx context.Context, rng *fencerv1.IDRange) (outcome, error) {
	var out outcome
	out.result.RequeueAfter = repairInterval
	rng.Status.ObservedGeneration = rng.Generation
	if v, ok := rng.Annotations[fencerv1.DeleteNextAnnotation]; ok && v != "true" {
		out.event(corev1.EventTypeWarning, fencerv1.ReasonIgnoredAnnotation, "%s is %q; only \"true\" has the next-ID key deleted with the IDRange, so it will be kept", fencerv1.DeleteNextAnnotation, v)
	}
	if rng.Spec.Min < 0 {
		// A negative slot has no key the store can list back, so every pass
		// would lease another; a negative block no pod can parse.
		msg := fmt.Sprintf("spec.min is %d; fencer allocates only from 0 up: create a new IDRange with min 0 or more", rng.Spec.Min)
		setRangeCondition(rng, fencerv1.ConditionReady, metav1.ConditionFalse, fencerv1.ReasonInvalidRange, msg)
		out.event(corev1.EventTypeWarning, fencerv1.ReasonInvalidRange, "%s", msg)
		out.result = ctrl.Result{}
		return out, nil
	}
	pods, err := r.pods(ctx, rng)
	if errors.Is(err, errInvalidSelector) {
		r.invalidSelector(ctx, rng, err, &out)
		return out, nil
	}
	if err != nil {
		return out, err
	}
	if _, err := r.Elector.Term(); err != nil {
		out.result.RequeueAfter = time.Second
		return out, nil
	}
	if rng.Spec.Mode == fencerv1.ModeBlocks {
		err = r.blocks(ctx, rng, pods, &out)
	} else {
		err = r.slots(ctx, rng, pods, &out)
	}
	if errors.Is(err, etcdstore.ErrNotLeader) {
		out.result.RequeueAfter = time.Second
		return out, nil
	}
	if errors.Is(err, errNextRegressed) {
		return out, nil
	}
	if err != nil {
		reason, msg := etcdFailure(err)
		setRangeCondition(rng, fencerv1.ConditionReady, metav1.ConditionFalse, reason, msg)
		out.event(corev1.EventTypeWarning, reason, "%s", msg)
		out.result.RequeueAfter = 2 * time.Second
		return out, nil
	}
	setRangeCondition(rng, fencerv1.ConditionReady, metav1.ConditionTrue, "Allocating", fmt.Sprintf("%s mode, [%d, %d]", rng.Spec.Mode, rng.Spec.Min, rng.Spec.Max))
	setLowCondition(rng)
	metrics.IDRangeRemaining.WithLabelValues(rng.Namespace, rng.Name).Set(float64(rng.Status.Remaining))
	metrics.IDRangeSize.WithLabelValues(rng.Namespace, rng.Name, string(rng.Spec.Mode)).Set(float64(rangeSize(rng)))
	return out, nil
}

// errNextRegressed stops a reconcile whose status already says why.
var errNextRegressed = errors.New("next-ID key regressed")

// exhausted sets the Exhausted condition, with an Event naming waiting pods.
func exhausted(rng *fencerv1.IDRange, is bool, waiting []string, out *outcome, format string, args ...any) {
	metrics.IDRangeWaiting.WithLabelValues(rng.Namespace, rng.Name).Set(float64(len(waiting)))
	if !is {
		setRangeCondition(rng, fencerv1.ConditionExhausted, metav1.ConditionFalse, "Available", "IDs remain")
		return
	}
	msg := fmt.Sprintf(format, args...)
	if len(waiting) > 0 {
		sort.Strings(waiting)
		msg += fmt.Sprintf("; waiting: %s", strings.Join(waiting, ", "))
		out.event(corev1.EventTypeWarning, fencerv1.ConditionExhausted, "%s", msg)
	}
	setRangeCondition(rng, fencerv1.ConditionExhausted, metav1.ConditionTrue, fencerv1.ConditionExhausted, msg)
}

// setLowCondition: Low when less than 10% of the range remains. It counts
// in integers: a float64 holds no more than 2^53 exactly, and a range near
// the top of int64 was reported as "5 of 1 remain", and not Low.
func setLowCondition(rng *fencerv1.IDRange) {
	total := rangeSize(rng)
	// remaining < total/10 without the division's rounding: r*10 < t holds
	// exactly when r < ceil(t/10).
	low := rng.Status.Remaining >= 0 && uint64(rng.Status.Remaining) < total/10+min(total%10, 1)
	status, reason := metav1.ConditionFalse, "Plenty"
	if low {
		status, reason = metav1.ConditionTrue, "Low"
	}
	setRangeCondition(rng, fencerv1.ConditionLow, status, reason, fmt.Sprintf("%d of %d remain", rng.Status.Remaining, total))
}

// rangeSize is how many IDs [min, max] holds (reconcileRange has refused a
// negative min; max is at least min).
func rangeSize(rng *fencerv1.IDRange) uint64 {
	return uint64(rng.Spec.Max-rng.Spec.Min) + 1
}

func setRangeCondition(rng *fencerv1.IDRange, typ string, status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&rng.Status.Conditions, metav1.Condition{Type: typ, Status: status, Reason: reason, Message: msg, ObservedGeneration: rng.Generation})
}

// invalidSelector is a pass over a range whose selector cannot be parsed:
// Ready False, one Warning per generation, nothing handed out, and, for
// Slots, the slots pods hold still renewed (keepHeldSlots), every
// repairInterval, as their pods come and go.
func (r *IDRangeReconciler) invalidSelector(ctx context.Context, rng *fencerv1.IDRange, err error, out *outcome) {
	msg := fmt.Sprintf("%v; no pod is given a block or slot until it is fixed, and those given stay", err)
	if c := meta.FindStatusCondition(rng.Status.Conditions, fencerv1.ConditionReady); c == nil || c.Reason != fencerv1.ReasonInvalidSelector || c.ObservedGeneration != rng.Generation {
		out.event(corev1.EventTypeWarning, fencerv1.ReasonInvalidSelector, "%s", msg)
	}
	setRangeCondition(rng, fencerv1.ConditionReady, metav1.ConditionFalse, fencerv1.ReasonInvalidSelector, msg)
	if rng.Spec.Mode != fencerv1.ModeSlots {
		out.result = ctrl.Result{} // a block needs no renewing; an edit of the spec wakes it
		return
	}
	if _, err := r.Elector.Term(); err != nil {
		out.result.RequeueAfter = time.Second
		return
	}
	if err := r.keepHeldSlots(ctx, rng, out); err != nil {
		// The status keeps the cause a user must fix; the Event says why
		// the slots were not renewed this time.
		reason, msg := etcdFailure(err)
		out.event(corev1.EventTypeWarning, reason, "%s", msg)
		out.result.RequeueAfter = 2 * time.Second
	}
}

// errInvalidSelector is the pods of an IDRange whose spec.podSelector
// cannot be parsed (a label value the API does not allow: the CRD has no
// rule for label syntax).
var errInvalidSelector = errors.New("spec.podSelector is invalid")

func (r *IDRangeReconciler) pods(ctx context.Context, rng *fencerv1.IDRange) ([]corev1.Pod, error) {
	sel, err := metav1.LabelSelectorAsSelector(&rng.Spec.PodSelector)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errInvalidSelector, err)
	}
	pods, err := podsMatching(ctx, r.Client, rng.Namespace, &rng.Spec.PodSelector, sel)
	if err != nil {
		return nil, err
	}
	sort.Slice(pods, func(i, j int) bool { return pods[i].Name < pods[j].Name })
	return pods, nil
}

// finalize releases the range's slots (their generators are fenced off at
// once) and, only on opt-in, its next-ID key.
func (r *IDRangeReconciler) finalize(ctx context.Context, rng *fencerv1.IDRange) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(rng, fencerv1.IDRangeFinalizer) {
		return ctrl.Result{}, nil
	}
	live, err := r.stillDeleting(ctx, rng)
	if live == nil || err != nil {
		return ctrl.Result{}, err
	}
	if _, err := r.Elector.Term(); err != nil {
		return ctrl.Result{RequeueAfter: time.Second}, nil
	}
	r.forget(rng.UID)
	slots, err := r.Store.Slots(ctx, rng.Namespace, rng.Name)
	if err != nil {
		return ctrl.Result{}, err
	}
	for _, sl := range slots {
		r.Renewer.Stop(etcdkeys.SlotKey(r.Store.Prefix(), rng.Namespace, rng.Name, sl.N))
	}
	if err := r.Store.ReleaseSlots(ctx, rng.Namespace, rng.Name, slots); err != nil {
		return ctrl.Result{}, err
	}
	// The opt-in as the API server has it now: one set just before the
	// delete may not have reached the cache.
	if live.Annotations[fencerv1.DeleteNextAnnotation] == "true" {
		if err := r.Store.DeleteNext(ctx, rng.Namespace, rng.Name); err != nil {
			return ctrl.Result{}, err
		}
	}
	pods, err := r.pods(ctx, rng)
	if errors.Is(err, errInvalidSelector) {
		// The pods it gave blocks or slots to, under a selector it could
		// read then, are among the namespace's.
		pods, err = podsMatching(ctx, r.Client, rng.Namespace, &metav1.LabelSelector{}, labels.Everything())
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	for i := range pods {
		if err := annotatePod(ctx, r.Client, &pods[i], nil, fencerv1.IDRangeAnnotationPrefix+rng.Name); err != nil {
			return ctrl.Result{}, err
		}
	}
	metrics.ForgetIDRange(rng.Namespace, rng.Name)
	return dropFinalizer(ctx, apiClientOf(r.Client, r.APIReader), rng, fencerv1.IDRangeFinalizer)
}

// stillDeleting reads rng afresh from the API server before its finalize
// releases anything. A pass working from a cache that is behind can show
// an IDRange whose finalizer an earlier pass already removed, after a new
// IDRange took its name: the slots and the next key are the new range's
// then, and finalizing again would revoke its slots and, with
// fencer.io/delete-next-on-delete, send its allocators back to min. It
// returns the fresh IDRange, or nil when there is nothing to finalize.
func (r *IDRangeReconciler) stillDeleting(ctx context.Context, rng *fencerv1.IDRange) (*fencerv1.IDRange, error) {
	live := &fencerv1.IDRange{}
	err := apiClientOf(r.Client, r.APIReader).live.Get(ctx, client.ObjectKeyFromObject(rng), live)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if live.UID != rng.UID || live.DeletionTimestamp.IsZero() || !controllerutil.ContainsFinalizer(live, fencerv1.IDRangeFinalizer) {
		return nil, nil
	}
	return live, nil
}

// SetupWithManager registers the controller; a new etcd term wakes every range.
func (r *IDRangeReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if err := mgr.Add(followTerms(r.Elector, r.Renewer, r.enqueueAll)); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(&fencerv1.IDRange{}).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(r.rangesForPod)).
		WatchesRawSource(r.wake.source()).
		Named("idrange").
		Complete(r)
}

func (r *IDRangeReconciler) enqueueAll(ctx context.Context) {
	var list fencerv1.IDRangeList
	if err := r.List(ctx, &list); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "listing IDRanges for a resync")
		return
	}
	for _, o := range list.Items {
		r.wake.wake(o.Namespace, o.Name)
	}
}

func (r *IDRangeReconciler) rangesForPod(ctx context.Context, obj client.Object) []reconcile.Request {
	var list fencerv1.IDRangeList
	if err := r.List(ctx, &list, client.InNamespace(obj.GetNamespace()), client.UnsafeDisableDeepCopy); err != nil {
		return nil
	}
	var reqs []reconcile.Request
	for _, o := range list.Items {
		sel, err := metav1.LabelSelectorAsSelector(&o.Spec.PodSelector)
		_, annotated := obj.GetAnnotations()[fencerv1.IDRangeAnnotationPrefix+o.Name]
		if annotated || (err == nil && sel.Matches(labels.Set(obj.GetLabels()))) {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&o)})
		}
	}
	return reqs
}
