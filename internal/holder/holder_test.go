package holder

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func pod(name string, created time.Time, ready bool) corev1.Pod {
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	return corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(created)},
		Status:     corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: status}}},
	}
}

func TestPickOldestReadyThenName(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	pods := []corev1.Pod{
		pod("c", t0.Add(2*time.Second), true),
		pod("a-not-ready", t0, false),
		pod("b", t0.Add(time.Second), true),
		pod("a", t0.Add(time.Second), true),
	}
	if got := Pick(pods); got == nil || got.Name != "a" {
		t.Fatalf("Pick = %v, want a (oldest Ready, then by name)", got)
	}
	deleting := metav1.Now()
	pods[3].DeletionTimestamp = &deleting
	if got := Pick(pods); got == nil || got.Name != "b" {
		t.Fatalf("Pick = %v, want b once a is being deleted", got)
	}
}

func TestPickNone(t *testing.T) {
	if got := Pick([]corev1.Pod{pod("x", time.Now(), false), {ObjectMeta: metav1.ObjectMeta{Name: "no-conditions"}}}); got != nil {
		t.Fatalf("Pick = %s, want nil when no pod is Ready", got.Name)
	}
	if Qualifies(nil) {
		t.Fatal("a missing pod qualified")
	}
}
