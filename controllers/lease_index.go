package controllers

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
)

// Indexes on Leases, so that a pod event finds its Leases without scanning
// (and copying) every Lease in the namespace: with 10,000 Leases and pods,
// a scan per pod event is 10⁸ copies at startup.
const (
	// indexSelectorLabel holds "key=value" for each matchLabels pair of a
	// Lease's holderSelector, and indexAnyLabel for a selector without
	// matchLabels (only matchExpressions), which any pod may match.
	indexSelectorLabel = "fencer.io/holder-selector-label"
	indexAnyLabel      = "*"
	// indexHolder holds status.holder.
	indexHolder = "fencer.io/holder"
)

func selectorLabelValues(obj client.Object) []string {
	l := obj.(*fencerv1.Lease)
	if len(l.Spec.HolderSelector.MatchLabels) == 0 {
		return []string{indexAnyLabel}
	}
	out := make([]string, 0, len(l.Spec.HolderSelector.MatchLabels))
	for k, v := range l.Spec.HolderSelector.MatchLabels {
		out = append(out, k+"="+v)
	}
	return out
}

func holderValues(obj client.Object) []string {
	if h := obj.(*fencerv1.Lease).Status.Holder; h != "" {
		return []string{h}
	}
	return nil
}

// addLeaseIndexes registers the indexes with the manager's cache.
func addLeaseIndexes(ctx context.Context, idx client.FieldIndexer) error {
	if err := idx.IndexField(ctx, &fencerv1.Lease{}, indexSelectorLabel, selectorLabelValues); err != nil {
		return err
	}
	return idx.IndexField(ctx, &fencerv1.Lease{}, indexHolder, holderValues)
}

// indexPodLabel holds "key=value" for each label of a pod, so that the pods
// a selector matches are found without scanning the namespace: with 10,000
// pods, a scan per reconcile was most of the manager's CPU.
const indexPodLabel = "fencer.io/pod-label"

func podLabelValues(obj client.Object) []string {
	out := make([]string, 0, len(obj.GetLabels()))
	for k, v := range obj.GetLabels() {
		out = append(out, k+"="+v)
	}
	return out
}

// addPodIndex registers the pod label index with the manager's cache.
func addPodIndex(ctx context.Context, idx client.FieldIndexer) error {
	return idx.IndexField(ctx, &corev1.Pod{}, indexPodLabel, podLabelValues)
}
