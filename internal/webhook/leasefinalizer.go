package webhook

import (
	"context"
	"slices"

	jsonv2 "github.com/go-json-experiment/json"
	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
)

// LeaseFinalizerPath is where the manager serves the Lease finalizer
// webhook.
const LeaseFinalizerPath = "/mutate-lease-finalizer"

// LeaseFinalizer puts fencer's finalizer (fencer.io/release) on a Lease as
// the apiserver admits its CREATE, so that the Lease is stored with it and
// the controller's first reconcile need not spend a write adding it: a
// grant then costs two apiserver writes (the status and the holder's
// annotation), not three.
//
// It only saves a write; it guards nothing. The controller still adds the
// finalizer before it grants a Lease that lacks it (the webhook was down,
// which its failurePolicy Ignore lets pass, or someone removed it), so a
// Lease is never granted without it. For the same reason it needs no trust
// in its caller: a forged review gets back a patch and changes nothing.
type LeaseFinalizer struct {
	// Finalize tells the namespaces whose Leases get the finalizer; nil
	// is every namespace. With --lease-delete-webhook it is only the
	// namespaces that webhook skips, as the controller's.
	Finalize func(namespace string) bool
}

// Handle admits a Lease's CREATE, with a patch adding the finalizer when
// the Lease lacks it. It never refuses: a Lease it cannot read is admitted
// as sent, and the controller adds the finalizer.
func (f *LeaseFinalizer) Handle(_ context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Create || req.SubResource != "" || req.Resource.Group != fencerv1.GroupVersion.Group || req.Resource.Resource != "leases" {
		return admission.Allowed("")
	}
	if f.Finalize != nil && !f.Finalize(req.Namespace) {
		return admission.Allowed("")
	}
	var lease struct {
		Metadata *struct {
			Finalizers []string `json:"finalizers"`
		} `json:"metadata"`
	}
	// (The apiserver sends the object as it encodes it: "metadata" is
	// there, spelled so.)
	if err := jsonv2.Unmarshal(req.Object.Raw, &lease, asTheAPIServerReads); err != nil || lease.Metadata == nil {
		return admission.Allowed("fencer could not read the Lease; its controller adds the finalizer")
	}
	fin := lease.Metadata.Finalizers
	if slices.Contains(fin, fencerv1.LeaseFinalizer) {
		return admission.Allowed("")
	}
	op := jsonpatch.JsonPatchOperation{Operation: "add", Path: "/metadata/finalizers/-", Value: fencerv1.LeaseFinalizer}
	if fin == nil {
		op = jsonpatch.JsonPatchOperation{Operation: "add", Path: "/metadata/finalizers", Value: []string{fencerv1.LeaseFinalizer}}
	}
	return admission.Patched("", op)
}
