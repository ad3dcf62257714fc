// Package etcdkeys is fencer's etcd key layout (docs/concepts.md), the one
// place that says where each key lives. The manager and the SDK both use it,
// so a workload's fenced transaction compares exactly the key the
// controller grants.
package etcdkeys

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// DefaultPrefix is the root of fencer's etcd keys unless the manager was
// started with --etcd-prefix.
const DefaultPrefix = "/fencer"

// ErrBadPrefix is wrapped by every error CheckPrefix returns.
var ErrBadPrefix = errors.New("not a fencer etcd prefix")

// CheckPrefix refuses a key prefix no fencer install can have: the
// manager's --etcd-prefix starts with '/', does not end with '/', and holds
// no ':', which separates the parts of fencer's etcd user names
// (<prefix>:manager, <prefix>:ns:<namespace>:<uid>). An SDK client given another
// prefix would read and write keys no install uses: with etcd auth off,
// silently, with IDs that overlap the controller's blocks.
func CheckPrefix(prefix string) error {
	switch {
	case !strings.HasPrefix(prefix, "/") || strings.HasSuffix(prefix, "/"):
		return fmt.Errorf("%w: %q must start with '/' and not end with '/', e.g. %s", ErrBadPrefix, prefix, DefaultPrefix)
	case strings.Contains(prefix, ":"):
		return fmt.Errorf("%w: %q must not contain ':', which separates the parts of fencer's etcd user names", ErrBadPrefix, prefix)
	}
	return nil
}

// OrDefault is prefix, or DefaultPrefix when prefix is empty, so an SDK
// caller that passes "" gets fencer's default keys, never keys below "/".
func OrDefault(prefix string) string {
	if prefix == "" {
		return DefaultPrefix
	}
	return prefix
}

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

// IDRangeClaimKey records, for the block starting at first, the pod the
// controller handed it to and its last ID: written in the transaction that
// claims the block, never changed. Namespace identities may read it but
// not write it, so a forged or copied block annotation is found out when
// the block is consumed.
func IDRangeClaimKey(prefix, namespace, name string, first int64) string {
	return join(prefix, "claims", namespace, name, strconv.FormatInt(first, 10))
}

// NamespaceClaimsPrefix is the prefix of every IDRangeClaimKey of one
// namespace.
func NamespaceClaimsPrefix(prefix, namespace string) string {
	return join(prefix, "claims", namespace) + "/"
}

// NamespaceLeasesPrefix is the prefix of every LeaseKey of one namespace.
func NamespaceLeasesPrefix(prefix, namespace string) string {
	return join(prefix, "leases", namespace) + "/"
}

// NamespaceIDRangesPrefix is the prefix of every IDRange key of one namespace.
func NamespaceIDRangesPrefix(prefix, namespace string) string {
	return join(prefix, "idranges", namespace) + "/"
}

// DataPrefix is where a namespace's workloads keep their own fenced etcd
// keys: the one place besides its IDRanges that its etcd identity may write.
func DataPrefix(prefix, namespace string) string {
	return join(prefix, "data", namespace) + "/"
}

// GrantMarkerKey is written by the controller in the same transaction that
// creates a lease key, so its ModRevision equals the key's CreateRevision
// for exactly the grants the controller made. A namespace's etcd identity
// may read its own, never write them: a Direct holder, which may write its
// lease key to renew it, cannot forge the marker to go with a key it
// re-creates, and the SDK's fence compares the marker too.
func GrantMarkerKey(prefix, namespace, name string) string {
	return join(prefix, "grants", namespace, name)
}

// GrantMarkersPrefix is the prefix every GrantMarkerKey starts with.
func GrantMarkersPrefix(prefix string) string { return join(prefix, "grants") + "/" }

// NamespaceGrantMarkersPrefix is the prefix of every GrantMarkerKey of one
// namespace.
func NamespaceGrantMarkersPrefix(prefix, namespace string) string {
	return join(prefix, "grants", namespace) + "/"
}

// DeletedLeaseKey records that the Lease object with this UID is deleted:
// fencer's webhook writes it as it admits the Lease's DELETE, in the
// transaction that releases the Lease's grant, and no grant is made for that
// UID while it exists. It lies outside every namespace's etcd permissions.
func DeletedLeaseKey(prefix, namespace, name, uid string) string {
	return DeletedLeasePrefix(prefix, namespace, name) + uid
}

// DeletedLeasePrefix is the prefix of the DeletedLeaseKeys of every Lease
// object that had this namespace and name.
func DeletedLeasePrefix(prefix, namespace, name string) string {
	return join(prefix, "deleted", namespace, name) + "/"
}

// DeletedLeasesPrefix is the prefix every DeletedLeaseKey starts with.
func DeletedLeasesPrefix(prefix string) string { return join(prefix, "deleted") + "/" }

// ParseDeletedLeaseKey splits a DeletedLeaseKey below prefix into the
// Lease's namespace, name and UID.
func ParseDeletedLeaseKey(prefix, key string) (namespace, name, uid string, ok bool) {
	rest, found := strings.CutPrefix(key, DeletedLeasesPrefix(prefix))
	parts := strings.Split(rest, "/")
	if !found || len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
		return "", "", "", false
	}
	return parts[0], parts[1], parts[2], true
}

// LeaderKey is the etcd election key of the active controller.
func LeaderKey(prefix string) string { return join(prefix, "controller", "leader") }

func join(parts ...string) string { return strings.Join(parts, "/") }

// SlotKey is the key of slot n of an IDRange.
func SlotKey(prefix, namespace, name string, n int64) string {
	return IDRangeSlotsPrefix(prefix, namespace, name) + strconv.FormatInt(n, 10)
}

// ParseSlotKey splits a SlotKey below prefix into the IDRange's namespace and
// name and the slot number.
func ParseSlotKey(prefix, key string) (namespace, name string, n int64, ok bool) {
	rest, found := strings.CutPrefix(key, prefix+"/idranges/")
	parts := strings.Split(rest, "/")
	if !found || len(parts) != 4 || parts[2] != "slots" || parts[0] == "" || parts[1] == "" {
		return "", "", 0, false
	}
	n, err := strconv.ParseInt(parts[3], 10, 64)
	// Only the canonical form SlotKey writes: no sign, no leading zeros.
	if err != nil || n < 0 || strconv.FormatInt(n, 10) != parts[3] {
		return "", "", 0, false
	}
	return parts[0], parts[1], n, true
}

// ParseLeaseKey splits a LeaseKey below prefix into namespace and name.
func ParseLeaseKey(prefix, key string) (namespace, name string, ok bool) {
	return SplitLeaseKey(LeasesPrefix(prefix), key)
}

// SplitLeaseKey splits a key below a LeasesPrefix (or GrantMarkersPrefix)
// into namespace and name.
func SplitLeaseKey(prefix, key string) (namespace, name string, ok bool) {
	rest, found := strings.CutPrefix(key, prefix)
	if !found {
		return "", "", false
	}
	namespace, name, ok = strings.Cut(rest, "/")
	return namespace, name, ok && namespace != "" && name != "" && !strings.Contains(name, "/")
}
