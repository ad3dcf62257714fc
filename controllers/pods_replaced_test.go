package controllers

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencer-io/fencer/test/support/testenv"
)

// A pod annotation computed for one pod never lands on another created
// under its name meanwhile (a StatefulSet's pod, or one force-deleted and
// recreated): the real apiserver refuses the patch, which names the old
// pod's UID, and the controller takes that as it takes a pod that is gone.
// A pod that is still the same one is patched, and one that is gone is no
// error.
func TestPodAnnotationNeverLandsOnAReplacedPod(t *testing.T) {
	_, c := testenv.Start(t)
	ctx := context.Background()
	const key = "lease.fencer.io/job"
	newPod := func() *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "worker-0", Namespace: "default"},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}}}
		if err := c.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	old := newPod()
	if err := annotatePod(ctx, c, old.DeepCopy(), map[string]string{key: "5"}, key); err != nil {
		t.Fatalf("annotating the pod itself: %v", err)
	}
	var got corev1.Pod
	if err := c.Get(ctx, client.ObjectKeyFromObject(old), &got); err != nil || got.Annotations[key] != "5" {
		t.Fatalf("the pod itself was not annotated: %v, %v", err, got.Annotations)
	}

	// Replaced under the same name, the old copy (as a cache still has it)
	// is what the controller would patch.
	stale := got.DeepCopy()
	if err := c.Delete(ctx, old, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	replacement := newPod()
	annotationOf := func(p *corev1.Pod) string {
		t.Helper()
		var got corev1.Pod
		if err := c.Get(ctx, client.ObjectKeyFromObject(p), &got); err != nil {
			t.Fatal(err)
		}
		if got.UID != replacement.UID {
			t.Fatalf("read pod uid %s; want the replacement %s", got.UID, replacement.UID)
		}
		return got.Annotations[key]
	}
	if err := annotatePod(ctx, c, stale.DeepCopy(), map[string]string{key: "9"}, key); err != nil {
		t.Fatalf("a patch meant for a replaced pod: %v; want it dropped as for a pod that is gone", err)
	}
	if got := annotationOf(replacement); got != "" {
		t.Fatalf("the replacement pod carries %s=%q, meant for the pod it replaced (uid %s)", key, got, stale.UID)
	}
	// Nor is a removal meant for the old pod applied to the new one.
	if err := annotatePod(ctx, c, replacement.DeepCopy(), map[string]string{key: "7"}, key); err != nil {
		t.Fatal(err)
	}
	if err := patchAnnotations(ctx, c, stale.DeepCopy(), nil, key); err != nil {
		t.Fatalf("a removal meant for a replaced pod: %v", err)
	}
	if got := annotationOf(replacement); got != "7" {
		t.Fatalf("the replacement pod's own %s is %q after a removal meant for the pod it replaced; want 7", key, got)
	}

	// Gone altogether: nothing to write, and no error.
	if err := c.Delete(ctx, replacement, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	if err := annotatePod(ctx, c, replacement, map[string]string{key: "9"}, key); err != nil {
		t.Fatalf("a patch for a pod that is gone: %v", err)
	}
}
