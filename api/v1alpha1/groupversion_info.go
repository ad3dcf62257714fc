// Package v1alpha1 holds the fencer.io/v1alpha1 API: the Lease, IDRange and
// WorkloadLease kinds.
//
// +kubebuilder:object:generate=true
// +groupName=fencer.io
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the API group and version of fencer's kinds.
	GroupVersion = schema.GroupVersion{Group: "fencer.io", Version: "v1alpha1"}

	// SchemeBuilder registers the kinds of this package with a runtime.Scheme.
	// It depends on apimachinery alone, so importing the API stays light.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the kinds of this package to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &Lease{}, &LeaseList{}, &IDRange{}, &IDRangeList{}, &WorkloadLease{}, &WorkloadLeaseList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
