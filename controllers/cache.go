package controllers

import (
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
)

// lastApplied is kubectl apply's copy of the whole object, often the
// largest annotation of a pod created by hand.
const lastApplied = "kubectl.kubernetes.io/last-applied-configuration"

// CacheOptions keep in the manager's cache only what the controllers and
// the webhook read. managedFields go from every object. Pods, the most
// numerous, keep their metadata (labels, annotations, owners, deletion),
// phase and conditions: which pods a Lease or IDRange selects, whether
// they are Ready, and which have finished. Their spec and the rest of their
// status are dropped, most of a pod's size. Nothing writes a cached pod
// back whole: annotations change by merge patch, which sends only the keys
// that differ. With namespaces, fencer's kinds, pods and the workloads
// WorkloadLeases name are watched in those namespaces only, so several
// installs can share a cluster.
func CacheOptions(namespaces []string) cache.Options {
	opts := cache.Options{
		DefaultTransform: cache.TransformStripManagedFields(),
		ByObject:         map[client.Object]cache.ByObject{&corev1.Pod{}: {Transform: TrimPod}},
	}
	if len(namespaces) == 0 {
		return opts
	}
	only := map[string]cache.Config{}
	for _, ns := range namespaces {
		only[ns] = cache.Config{}
	}
	opts.ByObject = map[client.Object]cache.ByObject{
		&fencerv1.Lease{}:         {Namespaces: only},
		&fencerv1.IDRange{}:       {Namespaces: only},
		&fencerv1.WorkloadLease{}: {Namespaces: only},
		&appsv1.StatefulSet{}:     {Namespaces: only},
		&batchv1.Job{}:            {Namespaces: only},
		&batchv1.CronJob{}:        {Namespaces: only},
		&corev1.Pod{}:             {Namespaces: only, Transform: TrimPod},
	}
	return opts
}

// TrimPod is the pod cache's transform (see CacheOptions). Objects that
// are not pods, such as the tombstones of deleted ones, pass unchanged.
func TrimPod(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	meta := pod.ObjectMeta
	meta.ManagedFields = nil
	if _, ok := meta.Annotations[lastApplied]; ok {
		annotations := make(map[string]string, len(meta.Annotations)-1)
		for k, v := range meta.Annotations {
			if k != lastApplied {
				annotations[k] = v
			}
		}
		meta.Annotations = annotations
	}
	return &corev1.Pod{
		TypeMeta:   pod.TypeMeta,
		ObjectMeta: meta,
		Status:     corev1.PodStatus{Phase: pod.Status.Phase, Conditions: trimConditions(pod.Status.Conditions)},
	}, nil
}

// trimConditions keeps each condition's type and status, and drops the
// messages and probe times, which change without changing readiness.
func trimConditions(in []corev1.PodCondition) []corev1.PodCondition {
	out := make([]corev1.PodCondition, len(in))
	for i, c := range in {
		out[i] = corev1.PodCondition{Type: c.Type, Status: c.Status, LastTransitionTime: c.LastTransitionTime}
	}
	return out
}
