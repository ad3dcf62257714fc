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

// A pod in a terminal phase never holds, even with its Ready condition
// still True (the pod garbage collector sets the phase alone): Pick takes
// the younger pod that still runs.
func TestPickSkipsAFinishedPodStillReady(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, phase := range []corev1.PodPhase{corev1.PodFailed, corev1.PodSucceeded} {
		old, repl := pod("old", t0, true), pod("repl", t0.Add(time.Second), true)
		old.Status.Phase = phase
		if Qualifies(&old) {
			t.Fatalf("a %s pod qualified", phase)
		}
		if got := Pick([]corev1.Pod{old, repl}); got == nil || got.Name != "repl" {
			t.Fatalf("Pick with the older pod %s = %v, want repl", phase, got)
		}
		if got := Pick([]corev1.Pod{old}); got != nil {
			t.Fatalf("Pick of a %s pod alone = %s, want nil", phase, got.Name)
		}
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

// TestPickPassesOver: a holder whose grant just expired goes after every
// other Ready pod, and is still picked when it is the only one.
func TestPickPassesOver(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	a, b := pod("a", t0, true), pod("b", t0.Add(time.Second), true)
	a.UID, b.UID = "uid-a", "uid-b"
	if got := Pick([]corev1.Pod{a, b}, "uid-a"); got == nil || got.Name != "b" {
		t.Fatalf("Pick passing over a = %v, want b", got)
	}
	if got := Pick([]corev1.Pod{a}, "uid-a"); got == nil || got.Name != "a" {
		t.Fatalf("Pick with only a, passed over = %v, want a", got)
	}
	b.Status.Conditions[0].Status = corev1.ConditionFalse
	if got := Pick([]corev1.Pod{a, b}, "uid-a"); got == nil || got.Name != "a" {
		t.Fatalf("Pick with b not Ready = %v, want a", got)
	}
}

// TestPickFallsBackToTheLongestPassedOver: when every Ready pod is passed
// over, the one passed over longest ago is picked, so two frozen pods
// cannot take turns forever.
func TestPickFallsBackToTheLongestPassedOver(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	a, b := pod("a", t0, true), pod("b", t0.Add(time.Second), true)
	a.UID, b.UID = "uid-a", "uid-b"
	if got := Pick([]corev1.Pod{a, b}, "uid-a", "uid-b"); got == nil || got.Name != "b" {
		t.Fatalf("Pick = %v, want b (passed over longest ago)", got)
	}
}
