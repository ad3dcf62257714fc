package controllers

import (
	"context"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/internal/etcdstore"
	"github.com/fencer-io/fencer/internal/holder"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
)

// notStatusOnly drops Lease updates that changed nothing but the status.
// Only the controller writes Lease status (the chart's status guard refuses
// anyone else), so such an update is its own write coming back: reconciling it
// again costs a read of etcd and the pods, per Lease, per status write.
var notStatusOnly = predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
	o, n := e.ObjectOld, e.ObjectNew
	return o.GetGeneration() != n.GetGeneration() ||
		!equality.Semantic.DeepEqual(o.GetLabels(), n.GetLabels()) ||
		!equality.Semantic.DeepEqual(o.GetAnnotations(), n.GetAnnotations()) ||
		!equality.Semantic.DeepEqual(o.GetFinalizers(), n.GetFinalizers()) ||
		!o.GetDeletionTimestamp().Equal(n.GetDeletionTimestamp())
}}

// SetupWithManager registers the controller and the runnables that feed it:
// the etcd watch of lease keys, and a resync whenever the etcd term changes.
func (r *LeaseReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if err := mgr.Add(leaderRunnable(r.watchEtcd)); err != nil {
		return err
	}
	if err := mgr.Add(followTerms(r.Elector, r.Renewer, r.enqueueAll)); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(&fencerv1.Lease{}, builder.WithPredicates(notStatusOnly)).
		Watches(&corev1.Pod{}, r.podEvents()).
		WatchesRawSource(r.wake.source()).
		Named("lease").
		WithOptions(controller.Options{MaxConcurrentReconciles: max(r.Workers, 1)}).
		Complete(r)
}

// watchEtcd wakes a Lease the moment its key is deleted or expires.
func (r *LeaseReconciler) watchEtcd(ctx context.Context) error {
	r.Store.WatchLeases(ctx, func(ev etcdstore.LeaseEvent) {
		if ev.Deleted {
			r.mem.markDeleted(etcdkeys.LeaseKey(r.Store.Prefix(), ev.Namespace, ev.Name), ev.At)
		}
		r.wake.wake(ev.Namespace, ev.Name)
	}, func() { r.enqueueAll(ctx) })
	return nil
}

// enqueueAll reconciles every Lease, and every Lease that etcd holds a
// grant or grant marker of: a Lease deleted while no manager looked (its
// finalizer removed by hand) is released by gone.
func (r *LeaseReconciler) enqueueAll(ctx context.Context) {
	var leases fencerv1.LeaseList
	if err := r.List(ctx, &leases, client.UnsafeDisableDeepCopy); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "listing Leases for a resync")
		return
	}
	for _, l := range leases.Items {
		r.wake.wake(l.Namespace, l.Name)
	}
	granted, err := r.Store.GrantedLeases(ctx)
	if err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "listing etcd's grants for a resync")
		return
	}
	for _, l := range granted {
		r.wake.wake(l.Namespace, l.Name)
	}
}

// leasesForPod maps a pod to the Leases that select it or that it holds.
func (r *LeaseReconciler) leasesForPod(ctx context.Context, obj client.Object) []reconcile.Request {
	// Candidates from the indexes: Leases whose matchLabels share a label
	// with the pod, Leases with only matchExpressions, and the Lease the pod
	// holds (it must hear that its holder changed). Then the full selector.
	keys := []string{indexAnyLabel}
	for k, v := range obj.GetLabels() {
		keys = append(keys, k+"="+v)
	}
	seen := map[client.ObjectKey]bool{}
	var reqs []reconcile.Request
	consider := func(index, value string) {
		var leases fencerv1.LeaseList
		if err := r.List(ctx, &leases, client.InNamespace(obj.GetNamespace()), client.MatchingFields{index: value}, client.UnsafeDisableDeepCopy); err != nil {
			return
		}
		for i := range leases.Items {
			l := &leases.Items[i]
			key := client.ObjectKeyFromObject(l)
			if seen[key] {
				continue
			}
			sel, err := metav1.LabelSelectorAsSelector(&l.Spec.HolderSelector)
			if index == indexHolder || (err == nil && sel.Matches(labels.Set(obj.GetLabels()))) {
				seen[key] = true
				reqs = append(reqs, reconcile.Request{NamespacedName: key})
			}
		}
	}
	consider(indexHolder, obj.GetName())
	for _, k := range keys {
		consider(indexSelectorLabel, k)
	}
	// The Leases whose annotations the pod carries, whether or not they
	// exist or select it: each removes what the pod must not carry.
	for _, name := range leasesAnnotated(obj.GetAnnotations()) {
		key := client.ObjectKey{Namespace: obj.GetNamespace(), Name: name}
		if !seen[key] {
			seen[key] = true
			reqs = append(reqs, reconcile.Request{NamespacedName: key})
		}
	}
	return reqs
}

// podEvents enqueues the Leases a pod event concerns (leasesForPod; for
// an update, those of the old pod and of the new), and first has the
// renewal of a grant the pod holds follow the pod as it now is
// (renewalFollowsPod). Only the new pod counts there: the old one of an
// update that shows the holder Ready again must not suspend its renewal.
func (r *LeaseReconciler) podEvents() handler.EventHandler {
	mapped := handler.EnqueueRequestsFromMapFunc(r.leasesForPod)
	return handler.Funcs{
		CreateFunc: func(ctx context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			r.renewalFollowsPod(ctx, e.Object, false)
			mapped.Create(ctx, e, q)
		},
		UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			r.renewalFollowsPod(ctx, e.ObjectNew, false)
			mapped.Update(ctx, e, q)
		},
		DeleteFunc: func(ctx context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			r.renewalFollowsPod(ctx, e.Object, true)
			mapped.Delete(ctx, e, q)
		},
		GenericFunc: mapped.Generic,
	}
}

// renewalFollowsPod suspends, the moment the informer shows it, the
// renewal of a grant the pod holds when the pod no longer qualifies (not
// Ready, being deleted, or gone), and resumes a suspended one when it
// qualifies again. The reconcile that ends the tenure may wait behind
// others, and a renewal sent meanwhile would push the tenure's end up to
// TTL/3 later. Only the renewal is suspended: the reconcile that follows
// (the event also queues the Lease) ends the tenure one TTL after the
// last renewal (tenureEnd), or resumes it. Leases from the cache may be
// behind etcd; the renewer acts only on the etcd lease their status names,
// so a status not yet showing a newer grant changes nothing.
func (r *LeaseReconciler) renewalFollowsPod(ctx context.Context, obj client.Object, gone bool) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	var leases fencerv1.LeaseList
	if err := r.List(ctx, &leases, client.InNamespace(pod.Namespace), client.MatchingFields{indexHolder: pod.Name}, client.UnsafeDisableDeepCopy); err != nil {
		return
	}
	for i := range leases.Items {
		l := &leases.Items[i]
		st := l.Status
		if l.Spec.Renewal == fencerv1.RenewalDirect || st.Holder != pod.Name || st.HolderUID != pod.UID || st.LeaseID == 0 {
			continue
		}
		key, id := etcdkeys.LeaseKey(r.Store.Prefix(), l.Namespace, l.Name), clientv3.LeaseID(st.LeaseID)
		if gone || !holder.Qualifies(pod) {
			r.Renewer.Suspend(key, id)
		} else {
			r.Renewer.Resume(key, id)
		}
	}
}
