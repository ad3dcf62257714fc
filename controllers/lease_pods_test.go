package controllers

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/internal/etcdstore"
)

// The removals that go ahead of the status write take away only tokens
// etcd had released by the revision the pass read: a pass that read before
// a newer grant (a replica deposed without knowing it yet, a pass that
// found the key empty a moment before the new leader granted) must not
// strip the new holder's annotation, whatever grant it saw.
func TestRemoveReleasedSparesTokensGrantedAfterTheRead(t *testing.T) {
	const key = fencerv1.HolderTokenAnnotationPrefix + "job"
	const idKey = fencerv1.HolderLeaseIDAnnotationPrefix + "job"
	pod := func(name, tok string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("uid-" + name),
			Annotations: map[string]string{key: tok, idKey: "99"}}}
	}
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(scheme).
		WithObjects(pod("ex-holder", "40"), pod("new-holder", "60"), pod("copied", "50"), pod("kept-holder", "45")).
		WithIndex(&corev1.Pod{}, indexPodLease, podLeaseValues).Build()
	r := &LeaseReconciler{Client: c}
	lease := &fencerv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "job", Namespace: "ns"}}
	g := &etcdstore.Grant{Token: 45, GrantValue: etcdstore.GrantValue{Holder: "kept-holder", HolderUID: "uid-kept-holder"}}
	if err := r.removeReleased(context.Background(), lease, nil, g, 50); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"ex-holder": "", "copied": "", "new-holder": "60", "kept-holder": "45"} {
		var got corev1.Pod
		if err := c.Get(context.Background(), client.ObjectKey{Namespace: "ns", Name: name}, &got); err != nil {
			t.Fatal(err)
		}
		if got.Annotations[key] != want || (want == "") != (got.Annotations[idKey] == "") {
			t.Errorf("%s: token %q, lease ID %q; want token %q", name, got.Annotations[key], got.Annotations[idKey], want)
		}
	}
}
