package controllers

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/internal/etcdstore"
	"github.com/fencer-io/fencer/internal/holder"
	"github.com/fencer-io/fencer/internal/metrics"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
)

// slots keeps one live slot per qualifying pod and repairs drift.
func (r *IDRangeReconciler) slots(ctx context.Context, rng *fencerv1.IDRange, pods []corev1.Pod, out *outcome) error {
	key := fencerv1.IDRangeAnnotationPrefix + rng.Name
	live, err := r.Store.Slots(ctx, rng.Namespace, rng.Name)
	if err != nil {
		return err
	}
	byUID := map[string]etcdstore.Slot{}
	inRange := 0
	for _, sl := range live {
		slotKey := etcdkeys.SlotKey(r.Store.Prefix(), rng.Namespace, rng.Name, sl.N)
		pod := podByUID(pods, sl.PodUID)
		switch {
		case sl.N < rng.Spec.Min || sl.N > rng.Spec.Max:
			if err := r.releaseOutOfRange(ctx, rng, sl, out); err != nil {
				return err
			}
			continue
		case pod == nil || !slotQualifies(pod):
			if r.Renewer.Renewing(slotKey, sl.LeaseID) {
				r.Renewer.Stop(slotKey)
				metrics.IDRangeRepairs.WithLabelValues("slot_without_pod").Inc()
				out.event(corev1.EventTypeNormal, "SlotFreed", "slot %d of %s is no longer renewed; it returns to the pool when its etcd lease expires", sl.N, sl.Pod)
			}
			inRange++
			continue
		}
		inRange++
		byUID[sl.PodUID] = sl
		r.Renewer.Ensure(slotKey, sl.LeaseID, r.Clock.Now())
	}
	var waiting []string
	ttl := time.Duration(*rng.Spec.SlotTTLSeconds) * time.Second
	for i := range pods {
		pod := &pods[i]
		if !slotQualifies(pod) {
			continue
		}
		sl, ok := byUID[string(pod.UID)]
		if !ok {
			if r.cacheBehind(ctx, rng, out) {
				continue // a slot leased on an older spec
			}
			if pod.Annotations[key] != "" {
				metrics.IDRangeRepairs.WithLabelValues("annotation_without_slot").Inc()
				out.event(corev1.EventTypeWarning, "Repaired", "pod %s carried %q without a live slot; leasing a new one", pod.Name, pod.Annotations[key])
			}
			got, err := r.Store.LeaseSlot(ctx, rng.Namespace, rng.Name, rng.Spec.Min, rng.Spec.Max, live, pod.Name, string(pod.UID), ttl)
			if errors.Is(err, etcdstore.ErrExhausted) {
				waiting = append(waiting, pod.Name)
				if err := annotatePod(ctx, r.Client, pod, nil, key); err != nil {
					return err
				}
				continue
			}
			if err != nil {
				return err
			}
			sl = *got
			live = append(live, sl)
			inRange++
			byUID[sl.PodUID] = sl
			r.Renewer.Ensure(etcdkeys.SlotKey(r.Store.Prefix(), rng.Namespace, rng.Name, sl.N), sl.LeaseID, r.Clock.Now())
		}
		want := fmt.Sprintf("slot=%d,token=%d", sl.N, sl.Token)
		if err := annotatePod(ctx, r.Client, pod, map[string]string{key: want}, key); err != nil {
			return err
		}
	}
	size := rng.Spec.Max - rng.Spec.Min + 1
	rng.Status.SlotsInUse = int32(inRange)
	rng.Status.Remaining = max(size-int64(inRange), 0)
	metrics.IDRangeSlotsInUse.WithLabelValues(rng.Namespace, rng.Name).Set(float64(inRange))
	exhausted(rng, len(waiting) > 0, waiting, out, "all %d slots are leased", size)
	return nil
}

// releaseOutOfRange releases a slot leased under an earlier range of this
// name (deleted, its finalizer removed by hand, and created again smaller
// within the slot's TTL): its worker ID may belong to another range now.
// It is released at once, which fences its generator off now, not one TTL
// later; its pod gets one of this range's slots.
func (r *IDRangeReconciler) releaseOutOfRange(ctx context.Context, rng *fencerv1.IDRange, sl etcdstore.Slot, out *outcome) error {
	if r.cacheBehind(ctx, rng, out) {
		// Until the cache says, the slot is kept as the last leader left it.
		r.Renewer.Ensure(etcdkeys.SlotKey(r.Store.Prefix(), rng.Namespace, rng.Name, sl.N), sl.LeaseID, r.Clock.Now())
		return nil
	}
	r.Renewer.Stop(etcdkeys.SlotKey(r.Store.Prefix(), rng.Namespace, rng.Name, sl.N))
	if err := r.Store.ReleaseSlots(ctx, rng.Namespace, rng.Name, []etcdstore.Slot{sl}); err != nil {
		return err
	}
	metrics.IDRangeRepairs.WithLabelValues("slot_out_of_range").Inc()
	out.event(corev1.EventTypeWarning, "SlotOutOfRange", "slot %d of %s lies outside [%d, %d]: released; the pod gets a slot in the range", sl.N, sl.Pod, rng.Spec.Min, rng.Spec.Max)
	return nil
}

// keepHeldSlots renews the live slots of rng whose pods still qualify, and
// does nothing else: with a selector it cannot read, the range hands out
// nothing, but what a pod holds stays its own, on this leader and on the
// next (whose renewer starts empty), so a typo in the selector does not
// take a running generator's worker ID away. A slot whose pod is gone is
// no longer renewed, as in slots.
func (r *IDRangeReconciler) keepHeldSlots(ctx context.Context, rng *fencerv1.IDRange, out *outcome) error {
	live, err := r.Store.Slots(ctx, rng.Namespace, rng.Name)
	if err != nil {
		return err
	}
	pods, err := podsMatching(ctx, r.Client, rng.Namespace, &metav1.LabelSelector{}, labels.Everything())
	if err != nil {
		return err
	}
	for _, sl := range live {
		slotKey := etcdkeys.SlotKey(r.Store.Prefix(), rng.Namespace, rng.Name, sl.N)
		switch pod := podByUID(pods, sl.PodUID); {
		case sl.N < rng.Spec.Min || sl.N > rng.Spec.Max:
			if err := r.releaseOutOfRange(ctx, rng, sl, out); err != nil {
				return err
			}
		case pod == nil || !slotQualifies(pod):
			r.Renewer.Stop(slotKey)
		default:
			r.Renewer.Ensure(slotKey, sl.LeaseID, r.Clock.Now())
		}
	}
	return nil
}

// slotQualifies: a pod keeps (and gets) a slot while it exists, is not being
// deleted and has not finished. Readiness is not required: a generator
// usually needs its worker ID before it can become Ready.
func slotQualifies(pod *corev1.Pod) bool {
	return pod.DeletionTimestamp == nil && !holder.Finished(pod)
}
