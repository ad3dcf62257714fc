package controllers

import (
	"context"
	"strconv"

	corev1 "k8s.io/api/core/v1"

	v1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/internal/etcdstore"
)

// Pod annotations fencer writes.
const (
	// TokenAnnotationPrefix + <lease-name> carries the holder's fencing token.
	TokenAnnotationPrefix = "lease.fencer.io/"
	// LeaseIDAnnotationPrefix + <lease-name> carries the etcd lease ID the
	// holder renews itself under renewal: Direct.
	LeaseIDAnnotationPrefix = "leaseid.fencer.io/"
)

// publish makes the pod annotations match the grant: the holder carries its
// token (and, for Direct renewal, its etcd lease ID), and every other
// candidate carries none. Removal is tidiness, never safety: the webhook and
// the SDK check tokens against etcd.
func (r *LeaseReconciler) publish(ctx context.Context, lease *v1.Lease, pods []corev1.Pod, g *etcdstore.Grant) error {
	tokenKey := TokenAnnotationPrefix + lease.Name
	idKey := LeaseIDAnnotationPrefix + lease.Name
	for i := range pods {
		pod := &pods[i]
		want := map[string]string{}
		if g != nil && pod.Name == g.Holder && string(pod.UID) == g.HolderUID {
			want[tokenKey] = strconv.FormatInt(g.Token, 10)
			if lease.Spec.Renewal == v1.RenewalDirect {
				want[idKey] = strconv.FormatInt(int64(g.LeaseID), 10)
			}
		}
		if err := annotatePod(ctx, r.Client, pod, want, tokenKey, idKey); err != nil {
			return err
		}
	}
	return nil
}
