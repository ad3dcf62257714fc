package webhook

import (
	"context"
	"fmt"
	"net/http"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
)

// +kubebuilder:rbac:groups=apps,resources=deployments;replicasets;statefulsets,verbs=get
// +kubebuilder:rbac:groups="",resources=replicationcontrollers;pods,verbs=get

// Parent validates subresource writes whose object has no labels of its
// own: a Scale, an Eviction. An objectSelector can never match them, so
// this webhook receives every such write and reads the parent object's
// labels to learn whether it is fenced. Its rules name the resources (the
// manager may read only those), see config/webhook.
type Parent struct {
	Checker *Checker
	// Reader reads the parent's metadata, uncached: a label added a moment
	// ago must count.
	Reader client.Reader
	Mapper meta.RESTMapper
}

// Handle decides one subresource write.
func (p *Parent) Handle(ctx context.Context, req admission.Request) admission.Response {
	start := time.Now()
	w, leaseName, d := p.parse(ctx, req)
	reason, resp := p.Checker.judge(ctx, req, w, leaseName, d)
	p.Checker.observe(ctx, req, reason, &resp, start)
	return resp
}

func (p *Parent) parse(ctx context.Context, req admission.Request) (write, string, *Denial) {
	w := write{user: req.UserInfo, tokenless: subresourceWrite(req)}
	if req.SubResource == "" {
		return w, "", nil
	}
	labels, err := p.parentLabels(ctx, req)
	if apierrors.IsNotFound(err) {
		return w, "", nil // the apiserver answers the write itself with 404
	}
	if err != nil {
		return w, "", &Denial{Code: http.StatusServiceUnavailable, Reason: ReasonLookupFailed,
			Message: fmt.Sprintf("fencer: cannot read %s %s/%s to learn whether it is fenced: %v; retry", req.Resource.Resource, req.Namespace, req.Name, err)}
	}
	lease := labels[fencerv1.LeaseLabel]
	if lease != "" {
		w.leaseRef = req.Namespace + "/" + lease
	}
	return w, lease, nil
}

func (p *Parent) parentLabels(ctx context.Context, req admission.Request) (map[string]string, error) {
	gvr := schema.GroupVersionResource{Group: req.Resource.Group, Version: req.Resource.Version, Resource: req.Resource.Resource}
	gvk, err := p.Mapper.KindFor(gvr)
	if err != nil {
		return nil, err
	}
	m := &metav1.PartialObjectMetadata{}
	m.SetGroupVersionKind(gvk)
	if err := p.Reader.Get(ctx, client.ObjectKey{Namespace: req.Namespace, Name: req.Name}, m); err != nil {
		return nil, err
	}
	return m.Labels, nil
}
