// Package v1alpha1 holds the fencer.io/v1alpha1 API: the Lease and IDRange kinds.
//
// +kubebuilder:object:generate=true
// +groupName=fencer.io
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the API group and version of fencer's kinds.
	GroupVersion = schema.GroupVersion{Group: "fencer.io", Version: "v1alpha1"}

	// SchemeBuilder registers the kinds of this package with a runtime.Scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the kinds of this package to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
