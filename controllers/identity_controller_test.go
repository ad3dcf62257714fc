package controllers

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
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

// A namespace's creation and deletion wake its identity, and so does an
// update that changes its UID: a namespace deleted and created again while
// the watch was down comes back from the relist as one update. Other
// updates (labels, status) do not.
func TestANamespaceWakesItsIdentityWhenItsUIDChanges(t *testing.T) {
	ns := func(uid string) *corev1.Namespace {
		return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "locks", UID: types.UID(uid)}}
	}
	if !createdOrDeleted.Create(event.CreateEvent{Object: ns("uid-1")}) || !createdOrDeleted.Delete(event.DeleteEvent{Object: ns("uid-1")}) {
		t.Error("a namespace's creation or deletion does not wake its identity")
	}
	if !createdOrDeleted.Update(event.UpdateEvent{ObjectOld: ns("uid-1"), ObjectNew: ns("uid-2")}) {
		t.Error("a namespace created again, seen as one update on a relist, does not wake its identity")
	}
	relabelled := ns("uid-1")
	relabelled.Labels = map[string]string{"team": "a"}
	if createdOrDeleted.Update(event.UpdateEvent{ObjectOld: ns("uid-1"), ObjectNew: relabelled}) {
		t.Error("a namespace's own update wakes its identity")
	}
	r := &IdentityReconciler{Always: []string{"locks"}}
	if got := r.alwaysNamespace(context.Background(), ns("uid-1")); len(got) != 1 || got[0].Namespace != "locks" {
		t.Errorf("a namespace named by --identity-namespaces wakes %v", got)
	}
	other := ns("uid-3")
	other.Name = "elsewhere"
	if got := r.alwaysNamespace(context.Background(), other); len(got) != 0 {
		t.Errorf("a namespace not named by --identity-namespaces wakes %v", got)
	}
}
