package api

import (
	"context"
	"slices"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/test/support/testenv"
)

// applyFinalizerPolicy creates the MutatingAdmissionPolicy and binding of
// config/policy (the chart's, rendered by make manifests) and removes them
// when the test ends.
func applyFinalizerPolicy(t *testing.T) {
	t.Helper()
	objs, err := testenv.CreateFromFile(context.Background(), cl, testenv.LeaseFinalizerPolicy)
	for _, obj := range objs {
		t.Cleanup(func() { _ = cl.Delete(context.Background(), obj) })
	}
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 2 {
		t.Fatalf("%s has %d objects, want the policy and its binding", testenv.LeaseFinalizerPolicy, len(objs))
	}
}

// With the chart's policy installed, a Lease has fencer's finalizer from
// the moment it is created, without the controller's extra write; only
// CREATE is mutated, so the controller can still remove it.
func TestLeaseFinalizerPolicy(t *testing.T) {
	applyFinalizerPolicy(t)
	ctx := context.Background()
	// The apiserver loads policies asynchronously.
	var l *fencerv1.Lease
	deadline := time.Now().Add(30 * time.Second)
	for {
		l = lease("")
		l.GenerateName = "policy-"
		// The client may not have discovered the CRD yet, either.
		err := cl.Create(ctx, l)
		if err == nil && slices.Contains(l.Finalizers, fencerv1.LeaseFinalizer) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a Lease created 30 s after the policy: finalizers %v (error %v), want %s", l.Finalizers, err, fencerv1.LeaseFinalizer)
		}
		time.Sleep(200 * time.Millisecond)
	}

	t.Run("set once, beside the user's own", func(t *testing.T) {
		for _, own := range [][]string{{fencerv1.LeaseFinalizer}, {"example.com/keep"}, {"example.com/keep", fencerv1.LeaseFinalizer}} {
			l := lease("")
			l.GenerateName = "own-"
			l.Finalizers = own
			if err := cl.Create(ctx, l); err != nil {
				t.Fatal(err)
			}
			want := slices.Clone(own)
			if !slices.Contains(want, fencerv1.LeaseFinalizer) {
				want = append(want, fencerv1.LeaseFinalizer)
			}
			slices.Sort(want)
			got := slices.Sorted(slices.Values(l.Finalizers))
			if !slices.Equal(got, want) {
				t.Errorf("created with finalizers %v: got %v, want %v", own, got, want)
			}
			drop(t, l)
		}
	})

	t.Run("an update that removes it is not undone", func(t *testing.T) {
		l.Finalizers = nil
		if err := cl.Update(ctx, l); err != nil {
			t.Fatal(err)
		}
		if len(l.Finalizers) != 0 {
			t.Fatalf("after removing the finalizer: %v", l.Finalizers)
		}
		if err := cl.Delete(ctx, l); err != nil {
			t.Fatal(err)
		}
		if err := cl.Get(ctx, client.ObjectKeyFromObject(l), l); err == nil {
			t.Errorf("the Lease is still there after delete, finalizers %v", l.Finalizers)
		}
	})
}

// drop removes l and its finalizers, as the controller would.
func drop(t *testing.T, l *fencerv1.Lease) {
	t.Helper()
	l.Finalizers = nil
	if err := cl.Update(context.Background(), l); err != nil {
		t.Fatal(err)
	}
	if err := cl.Delete(context.Background(), l); err != nil {
		t.Fatal(err)
	}
}
