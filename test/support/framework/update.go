package framework

import (
	"context"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Update reads the object named key into obj, applies set and writes it as
// c, and does so again on the apiserver's own conflicts (at most 50). The controller
// writes the same objects (a finalizer, a status, a recorded revision), and
// the apiserver checks the resourceVersion before admission runs: a
// conflict says only that the controller wrote between the read and this
// write, never what a test that calls this asks (whether admission lets c's
// write through). It returns the first other answer.
func Update(ctx context.Context, t *testing.T, c client.Client, key client.ObjectKey, obj client.Object, set func(client.Object)) error {
	t.Helper()
	return retryConflicts(ctx, t, c, key, obj, set, func() error { return c.Update(ctx, obj) })
}

// UpdateStatus is Update for the status subresource.
func UpdateStatus(ctx context.Context, t *testing.T, c client.Client, key client.ObjectKey, obj client.Object, set func(client.Object)) error {
	t.Helper()
	return retryConflicts(ctx, t, c, key, obj, set, func() error { return c.Status().Update(ctx, obj) })
}

func retryConflicts(ctx context.Context, t *testing.T, c client.Client, key client.ObjectKey, obj client.Object, set func(client.Object), write func() error) error {
	t.Helper()
	var err error
	for range 50 {
		if err := c.Get(ctx, key, obj); err != nil {
			t.Fatal(err)
		}
		set(obj)
		if err = write(); !staleResourceVersion(err) {
			return err
		}
	}
	t.Fatalf("%s: 50 writes in a row met a newer resourceVersion: %v", key, err)
	return err
}

// staleResourceVersion is the apiserver's own optimistic-concurrency
// conflict. fencer's webhook refuses with 409 Conflict too, so the status
// code alone would retry a refusal, the answer a test asks for, until the
// test's deadline.
func staleResourceVersion(err error) bool {
	return apierrors.IsConflict(err) && strings.Contains(err.Error(), "the object has been modified")
}
