// Package holder decides which pods may hold a Lease and in what order they
// are chosen.
package holder

import (
	"slices"
	"sort"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Qualifies reports whether pod may hold (or keep holding) a lease: it exists,
// is not being deleted, has not finished, and is Ready.
func Qualifies(pod *corev1.Pod) bool {
	if pod == nil || pod.DeletionTimestamp != nil || Finished(pod) {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// Finished reports whether pod is in a terminal phase, Succeeded or Failed.
// Its kubelet sets that once every container has ended, but so does the pod
// garbage collector before it force-deletes the pods of an out-of-service
// node, and anyone allowed to write pods/status, without touching the
// Ready condition. Kubernetes never runs a finished pod again and counts
// it as gone (a Job creates its replacement), so it may not hold a lease,
// whatever its Ready condition says.
func Finished(pod *corev1.Pod) bool {
	return pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
}

// Pick returns the pod that should receive a new grant, or nil if none
// qualifies. The order is stable and documented (docs/concepts.md): the
// Ready pod created first wins, ties broken by name. Oldest-first keeps a
// lease on long-lived pods during a rolling update, and a pod's position
// never depends on which controller replica decides. Pods in passOver go
// after every other Ready pod: they are picked only when no one else
// qualifies, and then the one listed last first.
func Pick(pods []corev1.Pod, passOver ...types.UID) *corev1.Pod {
	var ready, passed []*corev1.Pod
	for i := range pods {
		switch {
		case !Qualifies(&pods[i]):
		case slices.Contains(passOver, pods[i].UID):
			passed = append(passed, &pods[i])
		default:
			ready = append(ready, &pods[i])
		}
	}
	if len(ready) == 0 && len(passed) > 0 {
		sort.Slice(passed, func(i, j int) bool {
			return slices.Index(passOver, passed[i].UID) > slices.Index(passOver, passed[j].UID)
		})
		return passed[0]
	}
	if len(ready) == 0 {
		return nil
	}
	sort.Slice(ready, func(i, j int) bool {
		a, b := ready[i], ready[j]
		if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
			return a.CreationTimestamp.Before(&b.CreationTimestamp)
		}
		return a.Name < b.Name
	})
	return ready[0]
}
