// Package controllers holds fencer's reconcilers, one per kind.
package controllers

// Permissions the manager needs whatever it reconciles: Events anywhere, and
// its leader-election Lease in its own namespace (fencer-system here; the
// chart rewrites it to the release namespace).
//
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;create;update;patch;delete,namespace=fencer-system
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
