package webhook

import (
	"context"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache/informertest"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllertest"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
)

// fakeLeaseInformer is a LeaseView fed by a fake Lease informer.
func fakeLeaseInformer(t testing.TB) (*LeaseView, *controllertest.FakeInformer) {
	t.Helper()
	s := runtime.NewScheme()
	utilruntime.Must(fencerv1.AddToScheme(s))
	informers := &informertest.FakeInformers{Scheme: s}
	v, err := WatchLeases(context.Background(), informers)
	if err != nil {
		t.Fatal(err)
	}
	inf, err := informers.FakeInformerFor(context.Background(), &fencerv1.Lease{})
	if err != nil {
		t.Fatal(err)
	}
	return v, inf
}

// The view hands out the informer's own object, not a copy, and follows
// its adds, updates and deletes, including a delete it learned late.
func TestLeaseViewFollowsTheInformer(t *testing.T) {
	v, inf := fakeLeaseInformer(t)
	ctx := context.Background()
	notFound := func() {
		t.Helper()
		if _, err := v.Lease(ctx, "default", "report"); !apierrors.IsNotFound(err) {
			t.Fatalf("want NotFound, got %v", err)
		}
	}
	notFound()
	first := testLease(fencerv1.PolicyCurrent, false)
	inf.Add(first)
	if got, err := v.Lease(ctx, first.Namespace, first.Name); err != nil || got != first {
		t.Fatalf("got %p %v, want the informer's object %p", got, err, first)
	}
	second := first.DeepCopy()
	second.Status.Token = 99
	inf.Update(first, second)
	if got, _ := v.Lease(ctx, first.Namespace, first.Name); got != second {
		t.Fatalf("the update was not followed: %+v", got.Status)
	}
	inf.Delete(second)
	notFound()
	// A delete the informer missed and learned at relist.
	inf.Add(first)
	v.remove(toolscache.DeletedFinalStateUnknown{Key: "default/report", Obj: first})
	notFound()
}
