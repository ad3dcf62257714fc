package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// WorkloadKind names the kind of workload whose members a WorkloadLease
// fences.
// +kubebuilder:validation:Enum=StatefulSet;Job;CronJob
type WorkloadKind string

const (
	// WorkloadStatefulSet: a Lease per ordinal, named as the ordinal's pod
	// (<statefulset>-<ordinal>).
	WorkloadStatefulSet WorkloadKind = "StatefulSet"
	// WorkloadJob: an Indexed Job; a Lease per completion index, named
	// <job>-<index>.
	WorkloadJob WorkloadKind = "Job"
	// WorkloadCronJob: one Lease, named as the CronJob, held by the pod of
	// its newest Job: a newer run takes over from an older one still
	// running.
	WorkloadCronJob WorkloadKind = "CronJob"
)

// WorkloadRef names a workload in the WorkloadLease's namespace.
// +kubebuilder:validation:XValidation:rule="self.kind != 'CronJob' || size(self.name) <= 52",message="a CronJob's name is at most 52 characters (the apiserver refuses a longer one), so no CronJob can have this name"
type WorkloadRef struct {
	// kind is StatefulSet, Job (an Indexed Job) or CronJob.
	// +required
	Kind WorkloadKind `json:"kind"`
	// name is the workload's name.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')",message="must be a workload's name: lower-case letters, digits, '-' and '.', starting and ending with a letter or digit"
	// +required
	Name string `json:"name"`
}

// WorkloadLeaseSpec is the desired state of a WorkloadLease: which
// workload's members get a Lease, and the fields of those Leases that it
// owns.
type WorkloadLeaseSpec struct {
	// workload is the StatefulSet, Indexed Job or CronJob whose members
	// each get a Lease.
	// +required
	Workload WorkloadRef `json:"workload"`

	// ttlSeconds of each member's Lease.
	// +kubebuilder:default=15
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=3600
	// +optional
	TTLSeconds int32 `json:"ttlSeconds,omitempty"`

	// renewal of each member's Lease: PodReady or Direct.
	// +kubebuilder:default=PodReady
	// +optional
	Renewal RenewalMode `json:"renewal,omitempty"`

	// policy of each member's Lease: Current or Monotonic.
	// +kubebuilder:default=Current
	// +optional
	Policy FencingPolicy `json:"policy,omitempty"`

	// bindIdentity of each member's Lease.
	// +optional
	BindIdentity bool `json:"bindIdentity,omitempty"`

	// suspend, when true, suspends every member's Lease.
	// +optional
	Suspend bool `json:"suspend,omitempty"`

	// tokenDelivery of each member's Lease: PodAnnotations or LeaseStatus.
	// +kubebuilder:default=PodAnnotations
	// +optional
	TokenDelivery TokenDelivery `json:"tokenDelivery,omitempty"`
}

// WorkloadLeaseStatus is what the controller last saw of the members.
type WorkloadLeaseStatus struct {
	// members is how many member Leases the WorkloadLease keeps.
	// +optional
	Members int32 `json:"members"`
	// held is how many of them are held.
	// +optional
	Held int32 `json:"held"`
	// observedGeneration is the generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// conditions: Ready is true when every member has its Lease.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`
	// cronJobRun is, for a CronJob, the run whose pods its member Lease
	// selects, recorded before the Lease moves to it. When that run's Job
	// is deleted while its pods may still run, the Lease stays with it
	// rather than go back to an older run, and this record keeps it so
	// across manager restarts. Only the manager writes it.
	// +optional
	CronJobRun *CronJobRun `json:"cronJobRun,omitempty"`
}

// CronJobRun is a CronJob run selected for a member Lease.
type CronJobRun struct {
	// leaseUID is the UID of the member Lease it was selected for. A
	// Lease created again under the name (one deleted by hand) is given
	// this run only when it is newer than every Job left and of the same
	// CronJob (cronJobUID).
	// +required
	LeaseUID types.UID `json:"leaseUID"`
	// jobUID is the UID of the run's Job; the Lease selects the pods
	// labelled with it as their controller's.
	// +required
	JobUID types.UID `json:"jobUID"`
	// order places the run among the CronJob's runs: the second it was
	// scheduled for (never later than its Job's creation), zero-padded to
	// 20 digits, a slash, and the Job's name.
	// +kubebuilder:validation:MaxLength=320
	// +required
	Order string `json:"order"`
	// cronJobUID is the UID of the CronJob whose run it is: a member Lease
	// created again under its name (one deleted by hand) stays on this run
	// only while the WorkloadLease names the same CronJob. Empty in records
	// written before fencer recorded it.
	// +optional
	CronJobUID types.UID `json:"cronJobUID,omitempty"`
}

// MaxWorkloadMembers bounds the members of one WorkloadLease: a Lease (an
// object, an etcd key and a reconcile) per member of a larger workload
// would cost the manager more than one WorkloadLease should.
const MaxWorkloadMembers = 10000

// Reasons of a WorkloadLease's Ready condition, and of its Events.
const (
	// ReasonMembersLeased: every member has its Lease.
	ReasonMembersLeased = "MembersLeased"
	// ReasonWorkloadNotFound: the workload does not exist (yet).
	ReasonWorkloadNotFound = "WorkloadNotFound"
	// ReasonNotIndexed: a Job without completionMode Indexed has no
	// members to tell apart.
	ReasonNotIndexed = "NotIndexed"
	// ReasonTooManyMembers: the workload has more than MaxWorkloadMembers
	// members; the Leases of its members so far are kept.
	ReasonTooManyMembers = "TooManyMembers"
	// ReasonNameTaken: a member's Lease name is taken by a Lease the
	// WorkloadLease does not own; that member gets none.
	ReasonNameTaken = "NameTaken"
	// ReasonMemberLeaseDeleting: a member's Lease is being deleted and its
	// deletion waits on a finalizer; the member gets a new Lease once it is
	// gone.
	ReasonMemberLeaseDeleting = "MemberLeaseDeleting"
	// ReasonMemberLeaseReverted (an Event): a field of a member's Lease
	// that the WorkloadLease owns was edited, and set back.
	ReasonMemberLeaseReverted = "MemberLeaseReverted"
	// ReasonTakeover (an Event): a CronJob's Lease moved to its newest
	// run; the older run's pod, no longer selected, loses the tenure.
	ReasonTakeover = "Takeover"
)

// WorkloadLease gives each member of a workload a Lease of its own: each
// StatefulSet ordinal, each Indexed Job completion index, or a CronJob's
// newest run. The member Leases are ordinary Leases, owned by the
// WorkloadLease, that grant only to a sole pod of their member: a
// replacement pod gets a greater token once every other pod of the member
// is gone.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=wlease,categories=fencer
// +kubebuilder:printcolumn:name="Kind",type=string,JSONPath=`.spec.workload.kind`
// +kubebuilder:printcolumn:name="Workload",type=string,JSONPath=`.spec.workload.name`
// +kubebuilder:printcolumn:name="Members",type=integer,JSONPath=`.status.members`
// +kubebuilder:printcolumn:name="Held",type=integer,JSONPath=`.status.held`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="size(self.metadata.name) <= 63",message="WorkloadLease names are limited to 63 characters: each member Lease carries the name in its label fencer.io/workloadlease"
type WorkloadLease struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec WorkloadLeaseSpec `json:"spec"`
	// +optional
	Status WorkloadLeaseStatus `json:"status,omitempty"`
}

// WorkloadLeaseList is a list of WorkloadLeases.
//
// +kubebuilder:object:root=true
type WorkloadLeaseList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []WorkloadLease `json:"items"`
}
