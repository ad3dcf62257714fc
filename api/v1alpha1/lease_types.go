package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// RenewalMode says who keeps a grant's etcd lease alive.
// +kubebuilder:validation:Enum=PodReady;Direct
type RenewalMode string

const (
	// RenewalPodReady: the controller renews the etcd lease while the holder pod
	// exists and is Ready.
	RenewalPodReady RenewalMode = "PodReady"
	// RenewalDirect: the holder renews the etcd lease itself through the SDK,
	// using the lease ID the controller publishes.
	RenewalDirect RenewalMode = "Direct"
)

// FencingPolicy says which tokens the admission webhook accepts on fenced objects.
// +kubebuilder:validation:Enum=Current;Monotonic
type FencingPolicy string

const (
	// PolicyCurrent accepts only the lease's live token.
	PolicyCurrent FencingPolicy = "Current"
	// PolicyMonotonic accepts any token not lower than the live token.
	PolicyMonotonic FencingPolicy = "Monotonic"
)

// TokenDelivery says where the controller publishes a grant's token to its
// holder.
// +kubebuilder:validation:Enum=PodAnnotations;LeaseStatus
type TokenDelivery string

const (
	// DeliveryPodAnnotations: the holder pod's annotations carry its token
	// (and, under renewal Direct, its etcd lease ID), where the Downward API
	// and the SDK's FileSource and PodSource read them. The Lease's status
	// carries them too. One pod patch per grant.
	DeliveryPodAnnotations TokenDelivery = "PodAnnotations"
	// DeliveryLeaseStatus: only the Lease's status carries them; the holder
	// reads them through the API (the SDK's LeaseSource, which matches its
	// pod's name and UID). A grant costs no pod patch, and the Downward API
	// shows no token.
	DeliveryLeaseStatus TokenDelivery = "LeaseStatus"
)

// LeaseSpec is the desired state of a Lease.
type LeaseSpec struct {
	// ttlSeconds is the lifetime of a grant's etcd lease. A holder that stops
	// renewing loses the lease this long after its last renewal.
	// +kubebuilder:default=15
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=3600
	// +optional
	TTLSeconds int32 `json:"ttlSeconds,omitempty"`

	// holderSelector selects the candidate pods, in the Lease's namespace, that
	// may hold the lease.
	// +kubebuilder:validation:XValidation:rule="(has(self.matchLabels) && size(self.matchLabels) > 0) || (has(self.matchExpressions) && size(self.matchExpressions) > 0)",message="spec.holderSelector must select something: set matchLabels or matchExpressions (an empty selector would match every pod in the namespace)"
	// +kubebuilder:validation:XValidation:rule="!has(self.matchExpressions) || self.matchExpressions.all(e, e.operator in ['In', 'NotIn', 'Exists', 'DoesNotExist'])",message="spec.holderSelector.matchExpressions: operator must be one of In, NotIn, Exists, DoesNotExist"
	// +kubebuilder:validation:XValidation:rule="!has(self.matchExpressions) || self.matchExpressions.all(e, e.operator in ['Exists', 'DoesNotExist'] ? (!has(e.values) || size(e.values) == 0) : (has(e.values) && size(e.values) > 0))",message="spec.holderSelector.matchExpressions: values must be set for In and NotIn, and empty for Exists and DoesNotExist"
	// +required
	HolderSelector metav1.LabelSelector `json:"holderSelector"`

	// renewal says who keeps the grant alive: the controller while the holder
	// pod is Ready (PodReady), or the holder itself through the SDK (Direct).
	// +kubebuilder:default=PodReady
	// +optional
	Renewal RenewalMode `json:"renewal,omitempty"`

	// policy says which tokens the admission webhook accepts on objects fenced
	// by this lease: only the live token (Current), or any token not lower than
	// it (Monotonic).
	// +kubebuilder:default=Current
	// +optional
	Policy FencingPolicy `json:"policy,omitempty"`

	// bindIdentity, when true, lets only the holder pod's own service-account
	// identity write fenced objects with the token.
	// +optional
	BindIdentity bool `json:"bindIdentity,omitempty"`

	// suspend, when true, releases the current holder and grants to no one.
	// +optional
	Suspend bool `json:"suspend,omitempty"`

	// tokenDelivery says where the holder finds its token: in its pod's
	// annotations and the Lease's status (PodAnnotations), or in the
	// Lease's status alone (LeaseStatus), which saves a pod patch per grant
	// but shows no token through the Downward API. Changing it to
	// LeaseStatus removes the annotations from the pods.
	// +kubebuilder:default=PodAnnotations
	// +optional
	TokenDelivery TokenDelivery `json:"tokenDelivery,omitempty"`

	// soleCandidate, when true, grants only while the selector matches
	// exactly one pod object, terminating ones included: a replacement
	// pod waits until every other pod the selector matches is gone, or in
	// a terminal phase (Succeeded or Failed, which its kubelet reported
	// after every container ended). A
	// WorkloadLease sets it on the Lease of each member, whose selector
	// matches that member's pods only.
	// +optional
	SoleCandidate bool `json:"soleCandidate,omitempty"`
}

// TenureEndReason says why a tenure ended.
// +kubebuilder:validation:Enum=Expired;Released;HolderGone;HolderNotSelected;HolderNotReady;Suspended;Deleted
type TenureEndReason string

const (
	TenureExpired TenureEndReason = "Expired"
	// TenureReleased: a renewal: Direct holder gave the lease back with
	// fence.Release before its TTL ran out.
	TenureReleased TenureEndReason = "Released"
	// TenureHolderGone: the holder's pod object was deleted, or replaced
	// by one of the same name and a new UID (or, under renewal PodReady,
	// is terminating).
	TenureHolderGone TenureEndReason = "HolderGone"
	// TenureHolderNotSelected: the holder's pod no longer matches
	// spec.holderSelector (relabelled, or the selector changed).
	TenureHolderNotSelected TenureEndReason = "HolderNotSelected"
	TenureHolderNotReady    TenureEndReason = "HolderNotReady"
	TenureSuspended         TenureEndReason = "Suspended"
	TenureDeleted           TenureEndReason = "Deleted"
)

// Tenure is one past or present grant of a Lease.
type Tenure struct {
	// holder is the name of the pod that held the lease.
	Holder string `json:"holder"`
	// holderUID is the UID of that pod.
	// +optional
	HolderUID types.UID `json:"holderUID,omitempty"`
	// token is the fencing token of the grant.
	Token int64 `json:"token"`
	// start is when the grant was made.
	Start metav1.MicroTime `json:"start"`
	// end is when the tenure ended; unset while it lasts.
	// +optional
	End *metav1.MicroTime `json:"end,omitempty"`
	// endReason says why the tenure ended. It is unset on an ended tenure
	// when the manager that ended it stopped before writing the status.
	// +optional
	EndReason TenureEndReason `json:"endReason,omitempty"`
}

// HighestToken is the largest token the status records, current or in the
// history: no token above it has been issued, and etcd below it has gone
// back in time.
func (s *LeaseStatus) HighestToken() int64 {
	top := s.Token
	for _, t := range s.History {
		top = max(top, t.Token)
	}
	return top
}

// MaxLeaseHistory bounds status.history.
const MaxLeaseHistory = 10

// LeaseStatus is the observed state of a Lease.
type LeaseStatus struct {
	// holder is the name of the pod that holds the lease now.
	// +optional
	Holder string `json:"holder,omitempty"`
	// holderUID is the UID of the holder pod.
	// +optional
	HolderUID types.UID `json:"holderUID,omitempty"`
	// token is the fencing token of the current grant: the CreateRevision of
	// the lease's etcd key. It strictly increases from grant to grant.
	// +optional
	Token int64 `json:"token,omitempty"`
	// leaseID is the etcd lease ID the grant is attached to. With renewal
	// Direct the holder keeps it alive.
	// +optional
	LeaseID int64 `json:"leaseID,omitempty"`
	// acquireTime is when the current grant was made.
	// +optional
	AcquireTime *metav1.MicroTime `json:"acquireTime,omitempty"`
	// renewTime is when the controller last saw the grant renewed.
	// +optional
	RenewTime *metav1.MicroTime `json:"renewTime,omitempty"`
	// expireTime is when the grant runs out unless renewed.
	// +optional
	ExpireTime *metav1.MicroTime `json:"expireTime,omitempty"`
	// transitions counts the grants made to a different holder.
	// +optional
	Transitions int32 `json:"transitions,omitempty"`
	// history lists the most recent tenures, newest first.
	// +kubebuilder:validation:MaxItems=10
	// +listType=atomic
	// +optional
	History []Tenure `json:"history,omitempty"`
	// observedGeneration is the generation of the spec this status reflects.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// conditions: Held says whether a pod holds the lease, and why not.
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`
}

// ConditionHeld is true while a pod holds the lease.
const ConditionHeld = "Held"

// A Lease's Ready condition (ConditionReady) is true when the Lease is as
// its spec asks: held, or, with spec.suspend, held by no one. It has Held's
// reason and message otherwise, and the generation it describes:
// `kubectl wait --for=condition=Ready`, kstatus and Argo CD read it.

// Reasons of the Held condition.
const (
	ReasonGranted      = "Granted"
	ReasonNoCandidates = "NoCandidates"
	// ReasonOtherPodsRemain: spec.soleCandidate is true and the selector
	// matches more than one pod object: the member's replacement waits
	// until the others are gone.
	ReasonOtherPodsRemain = "OtherPodsRemain"
	// ReasonInvalidSelector: spec.holderSelector cannot be parsed (a label
	// value the API does not allow, say), so it matches no pod. An IDRange
	// whose spec.podSelector cannot be parsed is Ready False with it too.
	ReasonInvalidSelector = "InvalidSelector"
	ReasonExpired         = "Expired"
	// ReasonReleased (an Event): a tenure ended before its etcd lease
	// expired: by the controller, or by a renewal: Direct holder's
	// fence.Release.
	ReasonReleased        = "Released"
	ReasonSuspended       = "Suspended"
	ReasonEtcdUnavailable = "EtcdUnavailable"
	// ReasonEtcdNoSpace: etcd raised its NOSPACE alarm and refuses writes
	// until space is freed and the alarm disarmed (docs/operations.md).
	ReasonEtcdNoSpace = "EtcdNoSpace"
	// ReasonUnissuedGrant (an Event): the lease key held a grant fencer
	// never made, re-created by something with write access to the key; it
	// was deleted.
	ReasonUnissuedGrant = "UnissuedGrant"
	// ReasonEtcdRevisionRegressed: etcd's revision is below a token this
	// Lease already issued, as after a restore from a snapshot without
	// --bump-revision. Granting would reissue old tokens, so the controller
	// refuses until etcd's revision passes the highest token issued.
	ReasonEtcdRevisionRegressed = "EtcdRevisionRegressed"
	// ReasonDeleting: fencer's webhook admitted a DELETE of this Lease and
	// released its grant; nothing is granted while the deletion is
	// pending. If the apiserver did not carry the delete out (another
	// admission check refused it), the Lease is granted again once the
	// controller has confirmed it is still there (docs/concepts.md).
	ReasonDeleting = "Deleting"
	// ReasonPredecessorGrant (an Event): etcd held a grant made for an
	// earlier Lease object of the same name, deleted without fencer
	// releasing it; it was released, and this Lease granted anew.
	ReasonPredecessorGrant = "PredecessorGrant"
)

// Lease grants exclusive, fenced tenure to one pod among the pods its
// holderSelector matches. Each grant carries a fencing token, the etcd
// revision that created it, which the admission webhook and the SDK enforce.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=flease,categories=fencer
// +kubebuilder:printcolumn:name="Holder",type=string,JSONPath=`.status.holder`
// +kubebuilder:printcolumn:name="Token",type=integer,JSONPath=`.status.token`
// +kubebuilder:printcolumn:name="TTL",type=integer,JSONPath=`.spec.ttlSeconds`
// +kubebuilder:printcolumn:name="Renewal",type=string,JSONPath=`.spec.renewal`,priority=1
// +kubebuilder:printcolumn:name="Policy",type=string,JSONPath=`.spec.policy`,priority=1
// +kubebuilder:printcolumn:name="Transitions",type=integer,JSONPath=`.status.transitions`,priority=1
// +kubebuilder:printcolumn:name="Held",type=string,JSONPath=`.status.conditions[?(@.type=="Held")].reason`,priority=1
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="size(self.metadata.name) <= 63",message="Lease names are limited to 63 characters, so that the pod annotation key lease.fencer.io/<name> is valid"
type Lease struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec LeaseSpec `json:"spec"`
	// +optional
	Status LeaseStatus `json:"status,omitempty"`
}

// LeaseList is a list of Leases.
//
// +kubebuilder:object:root=true
type LeaseList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Lease `json:"items"`
}

// LastTenure is the newest tenure in the history, ended or not.
func (s *LeaseStatus) LastTenure() *Tenure {
	if len(s.History) == 0 {
		return nil
	}
	return &s.History[0]
}

// OpenTenure is the newest tenure if it has not ended: the one the status
// shows as current.
func (s *LeaseStatus) OpenTenure() *Tenure {
	if t := s.LastTenure(); t != nil && t.End == nil {
		return t
	}
	return nil
}
