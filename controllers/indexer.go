package controllers

import (
	"context"
	"fmt"
	"slices"
	"strings"

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

// The index functions check what they are given, as Kueue's do: a wrong
// object yields no index values, never a panic in the cache.

func selectorLabelValues(obj client.Object) []string {
	l, ok := obj.(*fencerv1.Lease)
	if !ok {
		return nil
	}
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
	if l, ok := obj.(*fencerv1.Lease); ok && l.Status.Holder != "" {
		return []string{l.Status.Holder}
	}
	return nil
}

// indexPodLabel holds "key=value" for each label of a pod, so that the pods
// a selector matches are found without scanning the namespace: with 10,000
// pods, a scan per reconcile was most of the manager's CPU.
const indexPodLabel = "fencer.io/pod-label"

func podLabelValues(obj client.Object) []string {
	if _, ok := obj.(*corev1.Pod); !ok {
		return nil
	}
	out := make([]string, 0, len(obj.GetLabels()))
	for k, v := range obj.GetLabels() {
		out = append(out, k+"="+v)
	}
	return out
}

// indexPodLease holds the name of each Lease whose token or etcd lease ID
// annotation a pod carries, so that the annotation is found on every pod
// that carries it, not only on the pods the Lease's selector matches: a
// holder relabelled out of the selector, or a pod given a copied
// annotation, must lose it too.
const indexPodLease = "fencer.io/pod-lease"

func podLeaseValues(obj client.Object) []string {
	if _, ok := obj.(*corev1.Pod); !ok {
		return nil
	}
	return leasesAnnotated(obj.GetAnnotations())
}

// leasesAnnotated names the Leases whose token or etcd lease ID
// annotations are among annotations.
func leasesAnnotated(annotations map[string]string) []string {
	var out []string
	for k := range annotations {
		name, ok := strings.CutPrefix(k, fencerv1.HolderTokenAnnotationPrefix)
		if !ok {
			name, ok = strings.CutPrefix(k, fencerv1.HolderLeaseIDAnnotationPrefix)
		}
		if ok && name != "" && !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	return out
}

// SetupIndexes registers every index the controllers read, in one place,
// before any controller starts.
func SetupIndexes(ctx context.Context, idx client.FieldIndexer) error {
	for _, ix := range []struct {
		obj   client.Object
		field string
		fn    client.IndexerFunc
	}{
		{&fencerv1.Lease{}, indexSelectorLabel, selectorLabelValues},
		{&fencerv1.Lease{}, indexHolder, holderValues},
		{&corev1.Pod{}, indexPodLabel, podLabelValues},
		{&corev1.Pod{}, indexPodLease, podLeaseValues},
		{&fencerv1.WorkloadLease{}, indexWorkload, workloadValues},
	} {
		if err := idx.IndexField(ctx, ix.obj, ix.field, ix.fn); err != nil {
			return fmt.Errorf("indexing %T by %s: %w", ix.obj, ix.field, err)
		}
	}
	return nil
}
