package controllers

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
)

// TestIdentityIgnoresStatusWrites: a namespace's identity is woken by a
// Lease's spec or deletion, never by the status write every grant makes.
func TestIdentityIgnoresStatusWrites(t *testing.T) {
	old := &fencerv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "l", Namespace: "ns", Generation: 1, ResourceVersion: "1"}}
	status := old.DeepCopy()
	status.ResourceVersion, status.Status.Token, status.Status.Holder = "2", 42, "p"
	spec := old.DeepCopy()
	spec.Generation, spec.Spec.Renewal = 2, fencerv1.RenewalDirect
	deleting := old.DeepCopy()
	deleting.DeletionTimestamp = &metav1.Time{}
	for _, c := range []struct {
		name string
		new  *fencerv1.Lease
		want bool
	}{{"status write", status, false}, {"spec change", spec, true}, {"deletion begun", deleting, true}} {
		if got := specOrDeletion.Update(event.UpdateEvent{ObjectOld: old, ObjectNew: c.new}); got != c.want {
			t.Errorf("%s: woken = %v, want %v", c.name, got, c.want)
		}
	}
	if !specOrDeletion.Create(event.CreateEvent{Object: old}) || !specOrDeletion.Delete(event.DeleteEvent{Object: old}) {
		t.Error("a Lease created or deleted must wake its namespace")
	}
}
