package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// Wire names: every label and annotation fencer reads or writes on objects
// it does not own. The manager, the webhook and the SDK all use these.
// ManagedByLabel marks objects fencer creates and owns, such as a
// namespace's etcd credentials Secret; fencer never touches one without it.
const (
	ManagedByLabel = "app.kubernetes.io/managed-by"
	ManagedByValue = "fencer"
)

const (
	// LeaseLabel fences an object: its value names the Lease, in the
	// object's namespace, whose token every write must send.
	LeaseLabel = "fencer.io/lease"

	// TokenAnnotation is the token a write sends. It is an offer for that one
	// write only: fencer's mutating webhook moves it to
	// WrittenTokenAnnotation, so the stored object never carries an offer a
	// later write could inherit.
	TokenAnnotation = "fencer.io/token"

	// WrittenTokenAnnotation records the token of the object's last accepted
	// write. Only fencer's mutating webhook sets it; the per-object check
	// refuses any later write with a lower token.
	WrittenTokenAnnotation = "fencer.io/written-token"

	// HolderTokenAnnotationPrefix + <lease-name> is the holder pod's token.
	HolderTokenAnnotationPrefix = "lease.fencer.io/"

	// HolderLeaseIDAnnotationPrefix + <lease-name> is the etcd lease ID of the
	// holder's grant, for renewal: Direct.
	HolderLeaseIDAnnotationPrefix = "leaseid.fencer.io/"

	// IDRangeAnnotationPrefix + <idrange-name> carries a pod's block or slot.
	IDRangeAnnotationPrefix = "idrange.fencer.io/"

	// LeaseFinalizer makes the controller release a Lease's etcd key before
	// the Lease goes away. With the opt-in Lease deletion webhook
	// (--lease-delete-webhook) the webhook releases it at the DELETE
	// instead, and only Leases in the namespaces it skips get it.
	LeaseFinalizer = "fencer.io/release"
	// IDRangeFinalizer makes the controller release slots before an IDRange
	// goes.
	IDRangeFinalizer = "fencer.io/release-slots"
	// DeleteNextAnnotation, set to "true" on an IDRange, deletes its next-ID
	// key with it. Without it the key is kept, so a range recreated under the
	// same name continues where the old one stopped and reissues nothing.
	DeleteNextAnnotation = "fencer.io/delete-next-on-delete"
)

// Cause types of the StatusCauses in a denial by fencer's webhook. A denial
// carries one cause of each type that applies, with the value in Message;
// the SDK reads these, never the human message.
const (
	// CauseReason is the DenialReason.
	CauseReason metav1.CauseType = "fencer.io/reason"
	// CauseLease is the Lease, as <namespace>/<name>.
	CauseLease metav1.CauseType = "fencer.io/lease"
	// CauseOfferedToken is the token the write sent, verbatim ("" if none).
	CauseOfferedToken metav1.CauseType = "fencer.io/offered-token"
	// CauseRecordedToken is the token of the object's last accepted write.
	CauseRecordedToken metav1.CauseType = "fencer.io/recorded-token"
	// CauseCurrentToken is the lease's live token ("0" when nobody holds it).
	CauseCurrentToken metav1.CauseType = "fencer.io/current-token"
	// CauseHolder is the live holder pod ("" when nobody holds it).
	CauseHolder metav1.CauseType = "fencer.io/holder"
)

// DenialReason says why fencer's webhook refused a write. The values are
// stable: the SDK and alerts match on them.
type DenialReason string

// Reasons for refusing a write.
const (
	DenialMissingToken DenialReason = "MissingToken"
	DenialMalformed    DenialReason = "MalformedToken"
	DenialForged       DenialReason = "ForgedToken"
	DenialBelowObject  DenialReason = "BelowObjectToken"
	DenialBelowLive    DenialReason = "BelowLiveToken"
	// DenialNotNewest: a write that fences an object (CREATE, or adding the
	// label) must send the newest token issued for the lease.
	DenialNotNewest    DenialReason = "NotNewestToken"
	DenialNoHolder     DenialReason = "NoHolder"
	DenialIdentity     DenialReason = "NotHolderIdentity"
	DenialUnknownLease DenialReason = "UnknownLease"
	DenialLabelChange  DenialReason = "LeaseLabelChanged"
	// DenialTokenless: a write that cannot carry a token (DELETE, /status,
	// /scale, another subresource) from neither the holder's bound identity
	// nor an exempt lifecycle identity.
	DenialTokenless DenialReason = "TokenlessWrite"
	// DenialRegressed: etcd's live grant is below a token the Lease already
	// issued (etcd restored from an old snapshot).
	DenialRegressed DenialReason = "EtcdRevisionRegressed"
	// DenialSuperseded: under policy Current, the token is below one the
	// Lease's status records as issued since, so it is stale whoever holds
	// the lease now; refused without reading etcd.
	DenialSuperseded DenialReason = "SupersededToken"
	// DenialLeaseReplaced: etcd's live grant was made for another Lease
	// object of the same name (the Lease was deleted and created again),
	// not the one the write's label names now.
	DenialLeaseReplaced DenialReason = "LeaseReplaced"
)
