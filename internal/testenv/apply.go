package testenv

import (
	"context"
	"fmt"
	"path/filepath"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencer-io/fencer/internal/manifest"
)

// LeaseFinalizerPolicy is the chart's MutatingAdmissionPolicy that sets
// the Lease finalizer at CREATE, as `make manifests` renders it for
// kustomize users, relative to the repository root.
const LeaseFinalizerPolicy = "config/policy/lease-finalizer.yaml"

// CreateFromFile creates every object of a multi-document YAML file under
// the repository root, and returns them.
func CreateFromFile(ctx context.Context, c client.Client, path string) ([]*unstructured.Unstructured, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	objs, err := manifest.Read(filepath.Join(root, path))
	if err != nil {
		return nil, err
	}
	for i, obj := range objs {
		if err := c.Create(ctx, obj); err != nil {
			return objs[:i], fmt.Errorf("creating %s %s from %s: %w", obj.GetKind(), obj.GetName(), path, err)
		}
	}
	return objs, nil
}
