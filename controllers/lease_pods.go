package controllers

import (
	"context"
	"fmt"
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
	for i := range pods {
		pod := &pods[i]
		want := map[string]string{}
		if g != nil && pod.Name == g.Holder && string(pod.UID) == g.HolderUID {
			want[tokenKey] = fencerv1.FormatToken(g.Token)
			if lease.Spec.Renewal == fencerv1.RenewalDirect {
				want[idKey] = strconv.FormatInt(int64(g.LeaseID), 10)
			}
		}
		if err := annotatePod(ctx, r.Client, pod, want, tokenKey, idKey); err != nil {
			return podsError{pod: pod.Name, err: err}
		}
	}
	return nil
}

// podsError is a pod patch that failed after etcd had changed: Reconcile
// still writes the status, so a grant is recorded (holder, token, history)
// while its pods cannot be annotated, and then retries the pods.
type podsError struct {
	pod string
	err error
}

func (e podsError) Error() string {
	return fmt.Sprintf("annotating pod %s: %v", e.pod, e.err)
}

func (e podsError) Unwrap() error { return e.err }
