package controllers

import (
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/internal/etcdstore"
	"github.com/fencer-io/fencer/internal/holder"
)

// tenureAction is what happens to a live grant.
type tenureAction int

const (
	endSuspended  tenureAction = iota // spec.suspend: release now
	endHolderLost                     // the holder's pod is gone, replaced or no longer selected: release now
	keepDirect                        // renewal Direct: the holder renews, etcd expiry ends it
	keepRenewing                      // a qualifying PodReady holder: the controller renews
	endUnrenewed                      // a PodReady holder that stopped qualifying: end one TTL after its last renewal
)

// decideTenure is keepOrEnd's decision, from the Lease and the holder pod
// among the pods the selector matches (nil when none has the holder's name
// and UID). One rule for every renewal mode: a holder whose pod object is
// gone, carries a new UID, is no longer selected or has finished (a
// terminal phase, which counts as gone: running) loses its tenure at
// once, even if its process still renews (Direct): the pod it was granted
// to is no longer a candidate, and its successor must not wait a TTL.
func decideTenure(lease *fencerv1.Lease, pod *corev1.Pod) tenureAction {
	switch {
	case lease.Spec.Suspend:
		return endSuspended
	case pod == nil, holder.Finished(pod):
		return endHolderLost
	case lease.Spec.Renewal == fencerv1.RenewalDirect:
		return keepDirect
	case holder.Qualifies(pod):
		return keepRenewing
	}
	return endUnrenewed
}

// decideHolder is decideTenure for g's holder among the candidates (pods),
// with, for endUnrenewed, why the holder no longer qualifies.
func decideHolder(lease *fencerv1.Lease, g *etcdstore.Grant, pods []corev1.Pod) (tenureAction, fencerv1.TenureEndReason) {
	pod := findPod(pods, g.Holder, g.HolderUID)
	action := decideTenure(lease, pod)
	if action == endUnrenewed {
		return action, whyNotQualified(pod)
	}
	return action, ""
}

// findPod is the candidate with the holder's name and UID, or nil.
func findPod(pods []corev1.Pod, name, uid string) *corev1.Pod {
	for i := range pods {
		if pods[i].Name == name && string(pods[i].UID) == uid {
			return &pods[i]
		}
	}
	return nil
}

// tenureEndFrom is when a grant no longer renewed ends: one TTL after its
// last renewal when this replica renewed it; otherwise (adopted from another
// replica) etcd's remaining TTL from now, plus a second, since etcd reports
// whole seconds rounded down and the tenure must never end before etcd
// would end it.
func tenureEndFrom(last time.Time, renewedHere bool, ttl, remaining time.Duration, now time.Time) time.Time {
	if renewedHere {
		return last.Add(ttl)
	}
	return now.Add(remaining + time.Second)
}

// whyNotQualified names why a holder no longer qualifies: gone (deleted, or
// being deleted) or merely not Ready.
func whyNotQualified(pod *corev1.Pod) fencerv1.TenureEndReason {
	if pod == nil || pod.DeletionTimestamp != nil {
		return fencerv1.TenureHolderGone
	}
	return fencerv1.TenureHolderNotReady
}

// running are the pods that may still run a container: all but those
// in a terminal phase (Succeeded, Failed), which their kubelet reported
// after every container ended. A partitioned node's pods report nothing
// and stay Running, terminating ones included.
func running(pods []corev1.Pod) []corev1.Pod {
	var out []corev1.Pod
	for i := range pods {
		if !holder.Finished(&pods[i]) {
			out = append(out, pods[i])
		}
	}
	return out
}

// othersRemain says why a soleCandidate Lease grants to none of the pods
// its selector matches: there is more than one.
func othersRemain(lease *fencerv1.Lease, pods []corev1.Pod) {
	names := make([]string, len(pods))
	for i := range pods {
		names[i] = pods[i].Name + " (" + string(pods[i].UID) + ")"
	}
	slices.Sort(names)
	setHeld(lease, metav1.ConditionFalse, fencerv1.ReasonOtherPodsRemain,
		fmt.Sprintf("spec.soleCandidate: %d pods match spec.holderSelector (%s); the lease is granted once only one remains", len(pods), strings.Join(names, ", ")))
}

// noCandidates says why no pod can be granted the Lease: none Ready
// matches, or the selector cannot be parsed.
func noCandidates(lease *fencerv1.Lease, out *outcome) {
	if _, err := metav1.LabelSelectorAsSelector(&lease.Spec.HolderSelector); err != nil {
		msg := fmt.Sprintf("spec.holderSelector is invalid and matches no pod: %v", err)
		setHeld(lease, metav1.ConditionFalse, fencerv1.ReasonInvalidSelector, msg)
		out.event(corev1.EventTypeWarning, fencerv1.ReasonInvalidSelector, "%s", msg)
		return
	}
	setHeld(lease, metav1.ConditionFalse, fencerv1.ReasonNoCandidates, fmt.Sprintf("no Ready pod matches spec.holderSelector in namespace %s", lease.Namespace))
}

// passOver lists, for a renewal: Direct Lease, the holders whose latest
// tenure ended Expired or Released, most recent first. One that expired
// stopped renewing (its process froze or died while its pod stays Ready):
// granting it again would only expire again, one TTL at a time, while the
// others wait. One that released gave the lease back for someone else.
// Pick prefers anyone not listed, then the one listed last: the holder
// that released longest ago, or else the one that expired longest ago. With renewal
// PodReady the controller renews, and an expiry is not the holder's doing.
func passOver(lease *fencerv1.Lease) []types.UID {
	if lease.Spec.Renewal != fencerv1.RenewalDirect {
		return nil
	}
	seen := map[types.UID]bool{}
	var expired, released []types.UID
	for _, t := range lease.Status.History { // newest first
		if seen[t.HolderUID] {
			continue
		}
		seen[t.HolderUID] = true
		switch t.EndReason {
		case fencerv1.TenureExpired:
			expired = append(expired, t.HolderUID)
		case fencerv1.TenureReleased:
			released = append(released, t.HolderUID)
		}
	}
	// Released holders last: when everyone is passed over, one that gave
	// the lease back is alive, and picked before one that let it expire.
	return append(expired, released...)
}
