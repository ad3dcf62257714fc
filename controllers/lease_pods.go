package controllers

import (
	"context"
	"strconv"

	corev1 "k8s.io/api/core/v1"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/internal/etcdstore"
)

// publish makes the pod annotations match the grant: the holder carries its
// token (and, for Direct renewal, its etcd lease ID), and every other
// candidate carries none. Removal is tidiness, never safety: the webhook and
// the SDK check tokens against etcd.
func (r *LeaseReconciler) publish(ctx context.Context, lease *fencerv1.Lease, pods []corev1.Pod, g *etcdstore.Grant) error {
	tokenKey := fencerv1.HolderTokenAnnotationPrefix + lease.Name
	idKey := fencerv1.HolderLeaseIDAnnotationPrefix + lease.Name
	candidates := make([]*corev1.Pod, len(pods))
	for i := range pods {
		candidates[i] = &pods[i]
	}
	return annotateEach(ctx, r.Client, candidates, func(pod *corev1.Pod) map[string]string {
		want := map[string]string{}
		if g != nil && pod.Name == g.Holder && string(pod.UID) == g.HolderUID {
			want[tokenKey] = fencerv1.FormatToken(g.Token)
			if lease.Spec.Renewal == fencerv1.RenewalDirect {
				want[idKey] = strconv.FormatInt(int64(g.LeaseID), 10)
			}
		}
		return want
	}, tokenKey, idKey)
}

// publishAfterStatus has the pods annotated once the status is written. A
// pod learns a token only after the status records it, so a manager that
// stops in between leaves no token in use that the status (and its check
// for an etcd restored from an old snapshot) does not know.
func (r *LeaseReconciler) publishAfterStatus(out *outcome, lease *fencerv1.Lease, pods []corev1.Pod, g *etcdstore.Grant) {
	out.afterStatus = func(ctx context.Context) error { return r.publish(ctx, lease, pods, g) }
}
