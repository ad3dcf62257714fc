package framework

import (
	"context"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// UpdateStatus reads the object named key into obj, applies set and writes
// its status as c, and does so again on the apiserver's own conflicts. The
// controller writes the same status, and the apiserver checks the
// resourceVersion before admission runs: a conflict says only that the
// controller wrote between the read and this write, never what a test that
// calls this asks (whether admission lets c's write through). It returns the
// first other answer.
func UpdateStatus(ctx context.Context, t *testing.T, c client.Client, key client.ObjectKey, obj client.Object, set func(client.Object)) error {
	t.Helper()
	for {
		if err := c.Get(ctx, key, obj); err != nil {
			t.Fatal(err)
		}
		set(obj)
		if err := c.Status().Update(ctx, obj); !apierrors.IsConflict(err) {
			return err
		}
	}
}
