package webhook

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/test/support/framework"
)

// looseCRD is a custom resource whose schema keeps unknown fields at the
// top level, so the apiserver stores a "Metadata" key beside "metadata".
func looseCRD(t *testing.T) schema.GroupVersionKind {
	t.Helper()
	crd := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
		"metadata": map[string]any{"name": "looses.example.fencer.io"},
		"spec": map[string]any{
			"group": "example.fencer.io", "scope": "Namespaced",
			"names": map[string]any{"plural": "looses", "singular": "loose", "kind": "Loose", "listKind": "LooseList"},
			"versions": []any{map[string]any{"name": "v1", "served": true, "storage": true,
				"schema": map[string]any{"openAPIV3Schema": map[string]any{"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}},
		},
	}}
	if err := fx.Client.Create(context.Background(), crd); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	gvk := schema.GroupVersionKind{Group: "example.fencer.io", Version: "v1", Kind: "Loose"}
	framework.Eventually(t, 30*time.Second, "the Loose CRD served", func() error {
		l := &unstructured.UnstructuredList{}
		l.SetGroupVersionKind(gvk.GroupVersion().WithKind("LooseList"))
		return fx.Client.List(context.Background(), l)
	})
	return gvk
}

// A custom resource that keeps unknown fields may store a top-level
// "Metadata". The apiserver reads only "metadata"; fencer once read both
// (encoding/json matches keys case-insensitively), so an unfenced object
// could carry, in "Metadata", a lease label and a forged record that
// fencer took for its own. Fencing it with an old token then passed as a
// write to an already fenced object, checked against the forged record,
// where a write that fences an object must send the newest token issued.
func TestWebhookReadsMetadataAsTheAPIServerDoes(t *testing.T) {
	ctx := context.Background()
	ns, first, old := setup(t, func(l *fencerv1.Lease) { l.Spec.Policy = fencerv1.PolicyMonotonic })
	gvk := looseCRD(t)
	// Two more tenures, then none: the newest token issued is above old,
	// and there is no live holder.
	if err := fx.Client.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: first}}, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	second, _ := held(t, ns, first)
	if err := fx.Client.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: second}}, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, 30*time.Second, "no holder", func() error {
		l := &fencerv1.Lease{}
		if err := fx.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "report"}, l); err != nil {
			return err
		}
		if l.Status.Holder != "" {
			return fmt.Errorf("held by %s", l.Status.Holder)
		}
		return nil
	})
	obj := &unstructured.Unstructured{Object: map[string]any{
		"metadata": map[string]any{"name": "loose", "namespace": ns},
		"Metadata": map[string]any{"labels": map[string]any{"fencer.io/lease": "report"},
			"annotations": map[string]any{"fencer.io/written-token": "1"}},
		"spec": map[string]any{"v": "1"},
	}}
	obj.SetGroupVersionKind(gvk)
	if err := fx.Client.Create(ctx, obj); err != nil {
		t.Fatalf("creating the unfenced object: %v", err)
	}
	patch := fmt.Sprintf(`{"metadata":{"labels":{"fencer.io/lease":"report"},"annotations":{"fencer.io/token":"%d"}},"spec":{"v":"2"}}`, old)
	err := fx.Client.Patch(ctx, obj, client.RawPatch(types.MergePatchType, []byte(patch)))
	refusedAs(t, err, fencerv1.DenialNotNewest, "must send the newest token issued")
	got := &unstructured.Unstructured{}
	got.SetGroupVersionKind(gvk)
	if err := fx.Client.Get(ctx, client.ObjectKeyFromObject(obj), got); err != nil {
		t.Fatal(err)
	}
	if _, kept := got.Object["Metadata"]; !kept {
		t.Fatal("the apiserver dropped the top-level Metadata: this test no longer tests anything")
	}
}
