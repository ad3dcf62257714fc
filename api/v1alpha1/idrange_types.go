package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// IDRangeMode says how an IDRange hands out IDs.
// +kubebuilder:validation:Enum=Blocks;Slots
type IDRangeMode string

const (
	// ModeBlocks hands each matching pod a block of blockSize unique IDs.
	ModeBlocks IDRangeMode = "Blocks"
	// ModeSlots leases each matching pod one worker-ID slot in [min,max].
	ModeSlots IDRangeMode = "Slots"
)

// IDRangeSpec is the desired state of an IDRange.
//
// +kubebuilder:validation:XValidation:rule="self.min <= self.max",message="spec.min must be less than or equal to spec.max"
// +kubebuilder:validation:XValidation:rule="self.mode != 'Blocks' || has(self.blockSize)",message="spec.blockSize is required when spec.mode is Blocks"
// +kubebuilder:validation:XValidation:rule="self.mode != 'Slots' || !has(self.blockSize)",message="spec.blockSize applies only to mode Blocks; remove it for mode Slots"
// +kubebuilder:validation:XValidation:rule="self.mode != 'Slots' || has(self.slotTTLSeconds)",message="spec.slotTTLSeconds is required when spec.mode is Slots"
// +kubebuilder:validation:XValidation:rule="self.mode != 'Blocks' || !has(self.slotTTLSeconds)",message="spec.slotTTLSeconds applies only to mode Slots; remove it for mode Blocks"
type IDRangeSpec struct {
	// mode is Blocks (unique ID blocks, segment mode) or Slots (leased
	// worker-ID slots for snowflake-style generators). It cannot change.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.mode is immutable; create a new IDRange instead"
	// +required
	Mode IDRangeMode `json:"mode"`

	// min is the first ID (Blocks) or slot (Slots) of the range, 0 or more.
	// It cannot change, since IDs below a raised min may already be in use.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.min is immutable, since IDs already issued depend on it"
	// +kubebuilder:validation:XValidation:rule="self >= 0",message="spec.min must be 0 or more: a block annotation, a worker-ID slot and the SDK's allocators carry no negative IDs"
	// +required
	Min int64 `json:"min"`

	// max is the last ID (Blocks) or slot (Slots) of the range, inclusive. It
	// may grow but never shrink.
	// +kubebuilder:validation:XValidation:rule="self >= oldSelf",message="spec.max may only grow; shrinking it would strand IDs already issued"
	// +kubebuilder:validation:XValidation:rule="self < 9223372036854775807",message="spec.max must be below 9223372036854775807, so that the next free ID stays representable"
	// +required
	Max int64 `json:"max"`

	// blockSize is how many IDs each block holds. Blocks mode only.
	// +kubebuilder:validation:Minimum=1
	// +optional
	BlockSize *int64 `json:"blockSize,omitempty"`

	// podSelector selects the pods, in the IDRange's namespace, that receive a
	// block or a slot.
	// +kubebuilder:validation:XValidation:rule="(has(self.matchLabels) && size(self.matchLabels) > 0) || (has(self.matchExpressions) && size(self.matchExpressions) > 0)",message="spec.podSelector must select something: set matchLabels or matchExpressions (an empty selector would match every pod in the namespace)"
	// +kubebuilder:validation:XValidation:rule="!has(self.matchExpressions) || self.matchExpressions.all(e, e.operator in ['In', 'NotIn', 'Exists', 'DoesNotExist'])",message="spec.podSelector.matchExpressions: operator must be one of In, NotIn, Exists, DoesNotExist"
	// +kubebuilder:validation:XValidation:rule="!has(self.matchExpressions) || self.matchExpressions.all(e, e.operator in ['Exists', 'DoesNotExist'] ? (!has(e.values) || size(e.values) == 0) : (has(e.values) && size(e.values) > 0))",message="spec.podSelector.matchExpressions: values must be set for In and NotIn, and empty for Exists and DoesNotExist"
	// +required
	PodSelector metav1.LabelSelector `json:"podSelector"`

	// slotTTLSeconds is the lifetime of a slot's etcd lease; a slot returns to
	// the pool only after it expires. Slots mode only.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=3600
	// +optional
	SlotTTLSeconds *int32 `json:"slotTTLSeconds,omitempty"`
}

// IDRangeStatus is the observed state of an IDRange.
type IDRangeStatus struct {
	// next is the first ID not yet handed out (Blocks).
	// +optional
	Next int64 `json:"next,omitempty"`
	// allocatedBlocks counts the blocks handed out (Blocks).
	// +optional
	AllocatedBlocks int64 `json:"allocatedBlocks,omitempty"`
	// remaining counts the IDs (Blocks) or free slots (Slots) left.
	// +optional
	Remaining int64 `json:"remaining,omitempty"`
	// slotsInUse counts the live slot leases (Slots).
	// +optional
	SlotsInUse int32 `json:"slotsInUse,omitempty"`
	// observedGeneration is the generation of the spec this status reflects.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// conditions: Ready, Low (less than 10% remains) and Exhausted.
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`
}

// Condition types of an IDRange. Ready is a Lease's too.
const (
	ConditionReady     = "Ready"
	ConditionLow       = "Low"
	ConditionExhausted = "Exhausted"
)

// ReasonNextRegressed: the next-ID key in etcd is below the status.next this
// IDRange already recorded (etcd restored from an old snapshot, or replaced),
// so claiming would hand out blocks again. Ready is False with this reason
// and no block is claimed until an operator repairs the key.
const ReasonNextRegressed = "NextRegressed"

// ReasonInvalidRange: the spec holds a range fencer does not allocate from
// (a negative spec.min, which the CRD refuses since it was added; an object
// stored before that keeps it). Ready is False with this reason and nothing
// is claimed or leased.
const ReasonInvalidRange = "InvalidRange"

// ReasonIgnoredAnnotation: the IDRange carries fencer.io/delete-next-on-delete
// with a value other than "true", which fencer ignores: its next-ID key
// stays in etcd when the IDRange is deleted. A Warning Event says so.
const ReasonIgnoredAnnotation = "IgnoredAnnotation"

// IDRange hands out unique ID blocks (mode Blocks) or leased worker-ID slots
// (mode Slots) to the pods its podSelector matches.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=idr,categories=fencer
// +kubebuilder:validation:XValidation:rule="size(self.metadata.name) <= 63",message="IDRange names are limited to 63 characters, so that the pod annotation key idrange.fencer.io/<name> is valid"
// +kubebuilder:printcolumn:name="Mode",type=string,JSONPath=`.spec.mode`
// +kubebuilder:printcolumn:name="Next",type=integer,JSONPath=`.status.next`
// +kubebuilder:printcolumn:name="InUse",type=integer,JSONPath=`.status.slotsInUse`
// +kubebuilder:printcolumn:name="Remaining",type=integer,JSONPath=`.status.remaining`
// +kubebuilder:printcolumn:name="Min",type=integer,JSONPath=`.spec.min`,priority=1
// +kubebuilder:printcolumn:name="Max",type=integer,JSONPath=`.spec.max`,priority=1
// +kubebuilder:printcolumn:name="BlockSize",type=integer,JSONPath=`.spec.blockSize`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type IDRange struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec IDRangeSpec `json:"spec"`
	// +optional
	Status IDRangeStatus `json:"status,omitempty"`
}

// IDRangeList is a list of IDRanges.
//
// +kubebuilder:object:root=true
type IDRangeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []IDRange `json:"items"`
}
