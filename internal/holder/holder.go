// Package holder decides which pods may hold a Lease and in what order they
// are chosen.
package holder

import (
	"sort"

	corev1 "k8s.io/api/core/v1"
)

// Qualifies reports whether pod may hold (or keep holding) a lease: it exists,
// is not being deleted, and is Ready.
func Qualifies(pod *corev1.Pod) bool {
	if pod == nil || pod.DeletionTimestamp != nil {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// Pick returns the pod that should receive a new grant, or nil if none
// qualifies. The order is stable and documented (docs/concepts.md): the
// Ready pod created first wins, ties broken by name. Oldest-first keeps a
// lease on long-lived pods during a rolling update, and a pod's position
// never depends on which controller replica decides.
func Pick(pods []corev1.Pod) *corev1.Pod {
	var ready []*corev1.Pod
	for i := range pods {
		if Qualifies(&pods[i]) {
			ready = append(ready, &pods[i])
		}
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
