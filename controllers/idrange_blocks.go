package controllers

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/internal/etcdstore"
	"github.com/fencer-io/fencer/internal/holder"
	"github.com/fencer-io/fencer/internal/metrics"
)

// blocks gives every matching pod without one a block.
func (r *IDRangeReconciler) blocks(ctx context.Context, rng *fencerv1.IDRange, pods []corev1.Pod, out *outcome) error {
	key := fencerv1.IDRangeAnnotationPrefix + rng.Name
	next, err := r.Store.ReadNext(ctx, rng.Namespace, rng.Name, rng.Spec.Min)
	if err != nil {
		return err
	}
	if next < rng.Status.Next {
		// Blocks below status.next were handed out already; claiming from
		// etcd's older value would hand them out again.
		msg := fmt.Sprintf("etcd's next ID %d is below status.next %d: etcd was restored from an old snapshot or replaced; "+
			"no block is claimed until the key is set to at least %d (see docs/operations.md)", next, rng.Status.Next, rng.Status.Next)
		setRangeCondition(rng, fencerv1.ConditionReady, metav1.ConditionFalse, fencerv1.ReasonNextRegressed, msg)
		out.event(corev1.EventTypeWarning, fencerv1.ReasonNextRegressed, "%s", msg)
		metrics.RevisionRegressions.Inc()
		return errNextRegressed
	}
	var waiting []string
	var given []*corev1.Pod
	// Blocks reach pods only once the status is written: status.next then
	// covers every block in use, so a manager that stops in between leaves
	// no ID in use that the check for a restored etcd does not know. This
	// also holds when a claim fails part way.
	id := rng.UID
	defer func() { out.afterStatus = r.annotateBlocks(id, key, given) }()
	advance := func(n int64) {
		next = n
		rng.Status.Next = next
		rng.Status.Remaining = remainingIDs(next, rng.Spec.Max)
	}
	advance(next)
	r.handed.prune(id, pods, key)
	r.own.prune(id, pods)
	for i := range pods {
		pod := &pods[i]
		if pod.DeletionTimestamp != nil || holder.Finished(pod) {
			continue // it will issue no more IDs
		}
		if _, ok := r.handed.get(id, pod.UID); ok {
			given = append(given, pod)
			continue
		}
		shown := pod.Annotations[key] // "" when none: such a pod is simply given a block
		switch r.checkAnnotation(ctx, rng, pod, shown, out) {
		case annotationOwn:
			continue
		case annotationRestored:
			given = append(given, pod)
			continue
		}
		if next > rng.Spec.Max {
			waiting = append(waiting, pod.Name)
			continue
		}
		b, n, err := r.Store.ClaimBlock(ctx, rng.Namespace, rng.Name, rng.Spec.Min, rng.Spec.Max, *rng.Spec.BlockSize, pod.Name, string(pod.UID))
		if errors.Is(err, etcdstore.ErrExhausted) {
			advance(n)
			waiting = append(waiting, pod.Name)
			continue
		}
		if err != nil {
			return err
		}
		advance(n)
		rng.Status.AllocatedBlocks++
		metrics.IDRangeBlocks.Inc()
		block := fmt.Sprintf("block=%d-%d", b.First, b.Last)
		r.handed.put(id, pod.UID, block)
		given = append(given, pod)
		if shown != "" { // a foreign block replaced
			metrics.IDRangeRepairs.WithLabelValues("block_not_claimed").Inc()
			out.event(corev1.EventTypeWarning, "Repaired", "pod %s carried %q, not a block fencer claimed for it (forged, copied from another pod, or damaged); gave it %s", pod.Name, shown, block)
		}
	}
	exhausted(rng, len(waiting) > 0 || rng.Status.Remaining == 0, waiting, out, "no IDs are left in [%d, %d]", rng.Spec.Min, rng.Spec.Max)
	return nil
}

// annotationCheck is what checkAnnotation found a pod's block annotation
// to be.
type annotationCheck int

const (
	// annotationOwn: a block claimed for this pod, or one not checked yet
	// (etcd did not answer; the next pass reads it again). Left alone.
	annotationOwn annotationCheck = iota
	// annotationRestored: not the pod's, but the pod's own block is known,
	// and is offered again in its place.
	annotationRestored
	// annotationForeign: not a block claimed for this pod, and no block of
	// its own is known: a new one is to be claimed.
	annotationForeign
)

// checkAnnotation says whether pod's annotation shown is a block this
// controller claimed for it. One that is not (forged, copied with the rest
// of another pod's metadata, damaged) is one idgen.ConsumeBlock refuses, so
// the pod would never have a block: it gets its own block back, when this
// manager has seen it, or a new one. A pod whose annotation was removed
// gets its own block back too. Each annotation is read from etcd once: a
// pod whose annotation is rewritten or removed again and again gets its
// own block back each time, not a new block each time, and a foreign one that
// waits for a block (the range exhausted) costs no read per pass.
func (r *IDRangeReconciler) checkAnnotation(ctx context.Context, rng *fencerv1.IDRange, pod *corev1.Pod, shown string, out *outcome) annotationCheck {
	switch {
	case shown == "": // none yet, or removed
	case r.own.is(rng.UID, pod.UID, shown):
		return annotationOwn
	case !r.own.foreign(rng.UID, pod.UID, shown):
		ok, err := r.Store.BlockClaimed(ctx, rng.Namespace, rng.Name, shown, pod.UID)
		if err != nil {
			return annotationOwn
		}
		if ok {
			r.own.put(rng.UID, pod.UID, shown)
			return annotationOwn
		}
		r.own.markForeign(rng.UID, pod.UID, shown)
	}
	if mine, ok := r.own.get(rng.UID, pod.UID); ok {
		r.handed.put(rng.UID, pod.UID, mine)
		if shown == "" {
			metrics.IDRangeRepairs.WithLabelValues("block_removed").Inc()
			out.event(corev1.EventTypeWarning, "Repaired", "pod %s lost the annotation of its block %s; restoring it", pod.Name, mine)
		} else {
			metrics.IDRangeRepairs.WithLabelValues("block_not_claimed").Inc()
			out.event(corev1.EventTypeWarning, "Repaired", "pod %s carried %q in place of its block %s; restoring it", pod.Name, shown, mine)
		}
		return annotationRestored
	}
	return annotationForeign
}

// annotateBlocks annotates each pod with the block handed to it
// (handedBlocks), which it is offered again if the write fails.
func (r *IDRangeReconciler) annotateBlocks(id types.UID, key string, pods []*corev1.Pod) func(context.Context) error {
	if len(pods) == 0 {
		return nil
	}
	return func(ctx context.Context) error {
		return annotateEach(ctx, r.Client, pods, func(pod *corev1.Pod) map[string]string {
			if block, ok := r.handed.get(id, pod.UID); ok {
				return map[string]string{key: block}
			}
			return nil
		}, key)
	}
}

// remainingIDs is max-next+1, clamped to [0, MaxInt64].
func remainingIDs(next, max int64) int64 {
	if next > max {
		return 0
	}
	if d := max - next; d >= 0 && d < 1<<63-1 {
		return d + 1
	}
	return 1<<63 - 1
}
