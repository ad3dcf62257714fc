package webhook

import (
	"context"
	"fmt"
	"net/http"
	"time"

	jsonv2 "github.com/go-json-experiment/json"
	admissionv1 "k8s.io/api/admission/v1"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/internal/etcdstore"
)

// LeaseDeletePath is where the manager serves the Lease deletion webhook.
const LeaseDeletePath = "/validate-lease-delete"

// DeletedReleaser releases a deleted Lease's grant
// (etcdstore.Store.ReleaseDeleted).
type DeletedReleaser interface {
	ReleaseDeleted(ctx context.Context, namespace, name, uid string, at time.Time) (*etcdstore.Grant, error)
}

// LeaseDeletion releases a Lease's grant in etcd as the apiserver admits the
// Lease's DELETE, before the Lease is gone, and records the deletion so that
// the controller, whose cache may still show the Lease, grants it to no one
// again. So a Lease's absence always follows its grant's release, as a
// finalizer would make it, without the write a finalizer costs per Lease:
// no write is accepted under a Lease that no longer exists, and a Lease
// created again under the same name never finds the old grant.
//
// It refuses the DELETE only when etcd cannot be reached (503): the Lease
// then stays, held, as it would behind a finalizer, until etcd is back.
type LeaseDeletion struct {
	Store DeletedReleaser
}

// Handle releases the grant of the Lease being deleted and admits the
// DELETE. A dry run releases nothing (the webhook declares
// sideEffects: NoneOnDryRun).
func (d *LeaseDeletion) Handle(ctx context.Context, req admission.Request) admission.Response {
	// Only a Lease's own DELETE: a webhook configuration that sent other
	// deletes here must not release the grant of a Lease that merely
	// shares their name.
	if req.Operation != admissionv1.Delete || req.SubResource != "" || req.Resource.Group != fencerv1.GroupVersion.Group || req.Resource.Resource != "leases" {
		return admission.Allowed("")
	}
	if req.DryRun != nil && *req.DryRun {
		return admission.Allowed("dry run: the grant stays")
	}
	// A DeleteCollection (how the namespace controller deletes a
	// namespace's Leases) is admitted object by object with the
	// collection's empty name: the object itself names the Lease.
	lease, err := deletedLease(req.OldObject.Raw, req.Namespace, req.Name)
	if err != nil {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf(
			"fencer: the DELETE of lease %s/%s came without a readable Lease object (oldObject), so fencer cannot tell which Lease's grant to release: %w", req.Namespace, req.Name, err))
	}
	// The date is for people reading the record; the controller's grace
	// goes by the record's age in etcd.
	if _, err := d.Store.ReleaseDeleted(ctx, lease.Namespace, lease.Name, lease.UID, time.Now()); err != nil {
		return admission.Errored(http.StatusServiceUnavailable, fmt.Errorf(
			"fencer: cannot release the grant of lease %s/%s in etcd before it is deleted (%w); the delete is refused so that no write is accepted under the grant of a Lease that is gone; retry once etcd is reachable", lease.Namespace, lease.Name, err))
	}
	return admission.Allowed("")
}

// leaseMeta is the part of a Lease object's metadata the webhook reads.
type leaseMeta struct {
	Namespace, Name, UID string
}

// deletedLease reads the namespace, name and UID of the Lease being deleted
// from its JSON. The request's namespace and name, when given, must match
// it; a DeleteCollection gives no name.
func deletedLease(raw []byte, namespace, name string) (leaseMeta, error) {
	if len(raw) == 0 {
		return leaseMeta{}, fmt.Errorf("no object")
	}
	var obj struct {
		Metadata struct {
			Namespace string `json:"namespace"`
			Name      string `json:"name"`
			UID       string `json:"uid"`
		} `json:"metadata"`
	}
	if err := jsonv2.Unmarshal(raw, &obj, asTheAPIServerReads); err != nil {
		return leaseMeta{}, err
	}
	m := obj.Metadata
	switch {
	case m.UID == "" || m.Name == "" || m.Namespace == "":
		return leaseMeta{}, fmt.Errorf("its metadata.namespace, name or uid is empty")
	case (name != "" && m.Name != name) || (namespace != "" && m.Namespace != namespace):
		return leaseMeta{}, fmt.Errorf("it names lease %s/%s", m.Namespace, m.Name)
	}
	return leaseMeta{Namespace: m.Namespace, Name: m.Name, UID: m.UID}, nil
}
