package controllers

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

// TestAnnotateEachPatchesOnlyWhatDiffersAndEveryPodItCan: pods already
// right get no patch; a pod whose patch fails is named in the error and
// keeps no other pod from its annotation.
func TestAnnotateEachPatchesOnlyWhatDiffersAndEveryPodItCan(t *testing.T) {
	const key = "lease.fencer.io/l"
	var pods []*corev1.Pod
	var objs []client.Object
	for i := range 20 {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p%d", i), Namespace: "ns"}}
		if i%2 == 0 {
			p.Annotations = map[string]string{key: "7"} // already right
		}
		pods = append(pods, p)
		objs = append(objs, p.DeepCopy())
	}
	var patches atomic.Int32
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).
		WithInterceptorFuncs(interceptor.Funcs{Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			patches.Add(1)
			if obj.GetName() == "p5" {
				return errors.New("refused")
			}
			return c.Patch(ctx, obj, patch, opts...)
		}}).Build()

	err := annotateEach(context.Background(), c, pods, func(*corev1.Pod) map[string]string { return map[string]string{key: "7"} }, key)
	if err == nil || !strings.Contains(err.Error(), "annotating pod p5: refused") {
		t.Fatalf("err = %v, want it to name p5", err)
	}
	if n := patches.Load(); n != 10 {
		t.Fatalf("%d patches, want 10: only the pods whose annotation differs", n)
	}
	for _, p := range pods {
		var got corev1.Pod
		if err := c.Get(context.Background(), client.ObjectKeyFromObject(p), &got); err != nil {
			t.Fatal(err)
		}
		if want := p.Name != "p5"; (got.Annotations[key] == "7") != want {
			t.Errorf("pod %s carries %q", p.Name, got.Annotations[key])
		}
	}
}
