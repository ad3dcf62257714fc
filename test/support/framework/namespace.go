package framework

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
)

// Namespace creates a fresh namespace for one test, emptied of fencer's
// objects when the test ends (emptyNamespace).
func (f *Fencer) Namespace(t *testing.T) string {
	t.Helper()
	ns := fmt.Sprintf("t%d", f.nsSeq.Add(1))
	if err := f.Client.Create(context.Background(), namespaceObject(ns)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.emptyNamespace(t, ns) })
	return ns
}

// finalizeWait bounds how long emptyNamespace leaves the test's managers to
// finalize the objects it deletes before it removes their finalizers.
const finalizeWait = 5 * time.Second

// emptyNamespace deletes the test's Leases, WorkloadLeases and IDRanges.
// envtest runs no namespace controller, so without this they would outlive
// the test, and every later test's manager, which watches all namespaces,
// would reconcile them: 200 Leases left by one test are 200 grants, and
// 200 Normal Events, in the next one's manager, which spend its whole Event
// budget (controllers.NormalEventBurst) and let a later assertion on an
// Event fail for a reason that has nothing to do with what it tests.
//
// It runs before the test's managers stop (cleanups run last first, and a
// test starts its manager before it asks for a namespace), so they release
// the etcd grants as a user's deletion would. A test that stopped its
// manager, or broke etcd, leaves finalizers no one removes: after
// finalizeWait they are taken off, and the etcd keys expire with their TTL.
func (f *Fencer) emptyNamespace(t *testing.T, ns string) {
	ctx := context.Background()
	lists := []client.ObjectList{&fencerv1.WorkloadLeaseList{}, &fencerv1.LeaseList{}, &fencerv1.IDRangeList{}}
	for _, list := range lists {
		obj, err := itemOf(f.Client, list)
		if err == nil {
			err = f.Client.DeleteAllOf(ctx, obj, client.InNamespace(ns))
		}
		if err != nil {
			t.Errorf("emptying namespace %s: %v", ns, err)
			return
		}
	}
	deadline := time.Now().Add(finalizeWait)
	for {
		left, err := f.remaining(ctx, ns, lists)
		if err != nil {
			t.Errorf("emptying namespace %s: %v", ns, err)
			return
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			f.dropFinalizers(ctx, t, left)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// remaining lists what is left of lists' kinds in ns.
func (f *Fencer) remaining(ctx context.Context, ns string, lists []client.ObjectList) ([]client.Object, error) {
	var left []client.Object
	for _, list := range lists {
		if err := f.Client.List(ctx, list, client.InNamespace(ns)); err != nil {
			return nil, err
		}
		if err := meta.EachListItem(list, func(o runtime.Object) error {
			left = append(left, o.(client.Object))
			return nil
		}); err != nil {
			return nil, err
		}
	}
	return left, nil
}

// dropFinalizers takes every finalizer off objs, which are being deleted.
func (f *Fencer) dropFinalizers(ctx context.Context, t *testing.T, objs []client.Object) {
	for _, obj := range objs {
		err := f.Client.Patch(ctx, obj, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`)))
		if client.IgnoreNotFound(err) != nil {
			t.Errorf("removing the finalizers of %T %s: %v", obj, client.ObjectKeyFromObject(obj), err)
		}
	}
}

// itemOf is a new object of the kind list holds.
func itemOf(c client.Client, list client.ObjectList) (client.Object, error) {
	gvk, err := c.GroupVersionKindFor(list)
	if err != nil {
		return nil, err
	}
	gvk.Kind = gvk.Kind[:len(gvk.Kind)-len("List")]
	obj, err := c.Scheme().New(gvk)
	if err != nil {
		return nil, err
	}
	return obj.(client.Object), nil
}

func namespaceObject(name string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
}
