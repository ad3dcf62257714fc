package etcdstore

import (
	"strconv"
	"strings"
)

// The key layout of docs/concepts.md. Every key lives below the configured prefix.

// LeaseKey is the key of a Lease's grant; its CreateRevision is the token.
func LeaseKey(prefix, namespace, name string) string {
	return join(prefix, "leases", namespace, name)
}

// LeasesPrefix is the prefix every LeaseKey starts with; the reconciler watches it.
func LeasesPrefix(prefix string) string { return join(prefix, "leases") + "/" }

// IDRangeNextKey holds the decimal next unallocated ID of a Blocks-mode IDRange.
func IDRangeNextKey(prefix, namespace, name string) string {
	return join(prefix, "idranges", namespace, name, "next")
}

// IDRangeSlotsPrefix is the prefix of a Slots-mode IDRange's slot keys.
func IDRangeSlotsPrefix(prefix, namespace, name string) string {
	return join(prefix, "idranges", namespace, name, "slots") + "/"
}

// IDRangeConsumedKey marks the block starting at first, delivered by pod
// annotation, as consumed: created once by the first container start that
// uses it, so a restarted container can tell a used block from a fresh one.
func IDRangeConsumedKey(prefix, namespace, name string, first int64) string {
	return join(prefix, "idranges", namespace, name, "consumed", strconv.FormatInt(first, 10))
}

// LeaderKey is the etcd election key of the active controller.
func LeaderKey(prefix string) string { return join(prefix, "controller", "leader") }

func join(parts ...string) string { return strings.Join(parts, "/") }
