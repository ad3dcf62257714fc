// Package controllers holds fencer's reconcilers, one per kind.
package controllers

// Permissions the manager needs whatever it reconciles: its leader-election
// Lease, and Events.
//
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
