package controllers

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fencer-io/fencer/internal/holder"
)

func TestTrimPodKeepsWhatTheControllersRead(t *testing.T) {
	now := metav1.Now()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: "p", Namespace: "ns", UID: "u", ResourceVersion: "7", CreationTimestamp: now, DeletionTimestamp: &now,
			Labels:          map[string]string{"app": "a"},
			Annotations:     map[string]string{"fencer.io/token": "5", lastApplied: `{"huge":"..."}`},
			OwnerReferences: []metav1.OwnerReference{{Kind: "ReplicaSet", Name: "rs", UID: "o"}},
			Finalizers:      []string{"f"},
			ManagedFields:   []metav1.ManagedFieldsEntry{{Manager: "kubectl"}},
		},
		Spec: corev1.PodSpec{NodeName: "n", ServiceAccountName: "sa", Containers: []corev1.Container{{Name: "c", Image: "i"}}},
		Status: corev1.PodStatus{
			Phase: corev1.PodRunning, PodIP: "10.0.0.1",
			Conditions:        []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, Message: "m", LastProbeTime: now, LastTransitionTime: now}},
			ContainerStatuses: []corev1.ContainerStatus{{Name: "c", Ready: true}},
		},
	}
	out, err := TrimPod(pod.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	got := out.(*corev1.Pod)
	want := pod.ObjectMeta.DeepCopy()
	want.ManagedFields = nil
	delete(want.Annotations, lastApplied)
	if !reflect.DeepEqual(got.ObjectMeta, *want) {
		t.Errorf("metadata: got %+v, want %+v", got.ObjectMeta, *want)
	}
	if !reflect.DeepEqual(got.Spec, corev1.PodSpec{}) || got.Status.PodIP != "" || got.Status.ContainerStatuses != nil {
		t.Errorf("spec and the rest of the status should be gone: %+v %+v", got.Spec, got.Status)
	}
	if got.Status.Phase != corev1.PodRunning || len(got.Status.Conditions) != 1 || got.Status.Conditions[0].Type != corev1.PodReady || got.Status.Conditions[0].Status != corev1.ConditionTrue {
		t.Errorf("phase and readiness lost: %+v", got.Status)
	}
	pod.DeletionTimestamp = nil
	trimmed, _ := TrimPod(pod.DeepCopy())
	if !holder.Qualifies(trimmed.(*corev1.Pod)) || !holder.Qualifies(pod) {
		t.Error("a Ready pod no longer qualifies once trimmed")
	}
	tomb := "not a pod"
	if o, _ := TrimPod(tomb); o != tomb {
		t.Error("a non-pod should pass unchanged")
	}
}
