package controllers

import (
	"context"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/internal/etcdstore"
)

// publish makes the pod annotations match the grant: the holder carries its
// token (and, for Direct renewal, its etcd lease ID) unless the Lease
// delivers tokens through its status alone, and every other pod carries
// none: the other candidates, and any pod found carrying the
// Lease's annotations (a holder relabelled out of the selector, a pod given
// a copied annotation). Removal is not what the fences rest on (the webhook
// and the SDK's etcd transactions check tokens against etcd), but pods and
// the SDK's sources read their token there, and a pod must not report a
// token it does not hold.
//
// With removalsOnly, the holder's annotations are left as they are and only
// the other pods' are removed.
func (r *LeaseReconciler) publish(ctx context.Context, lease *fencerv1.Lease, pods []corev1.Pod, g *etcdstore.Grant, removalsOnly bool) error {
	tokenKey := fencerv1.HolderTokenAnnotationPrefix + lease.Name
	idKey := fencerv1.HolderLeaseIDAnnotationPrefix + lease.Name
	annotated, err := r.annotatedFor(ctx, lease.Namespace, lease.Name)
	if err != nil {
		return err
	}
	byAnnotation := lease.Spec.TokenDelivery != fencerv1.DeliveryLeaseStatus
	return annotateEach(ctx, r.Client, union(pods, annotated), func(pod *corev1.Pod) map[string]string {
		want := map[string]string{}
		if g != nil && byAnnotation && pod.Name == g.Holder && string(pod.UID) == g.HolderUID {
			if removalsOnly {
				return annotationsOf(pod, tokenKey, idKey)
			}
			want[tokenKey] = fencerv1.FormatToken(g.Token)
			if lease.Spec.Renewal == fencerv1.RenewalDirect {
				want[idKey] = strconv.FormatInt(int64(g.LeaseID), 10)
			}
		}
		return want
	}, tokenKey, idKey)
}

// annotationsOf is the pod's own values of keys, those it carries.
func annotationsOf(pod *corev1.Pod, keys ...string) map[string]string {
	have := map[string]string{}
	for _, k := range keys {
		if v, ok := pod.Annotations[k]; ok {
			have[k] = v
		}
	}
	return have
}

// unpublish removes a Lease's annotations from every pod that carries
// them: the Lease is gone.
func (r *LeaseReconciler) unpublish(ctx context.Context, namespace, name string) error {
	annotated, err := r.annotatedFor(ctx, namespace, name)
	if err != nil {
		return err
	}
	none := func(*corev1.Pod) map[string]string { return nil }
	return annotateEach(ctx, r.Client, union(annotated), none,
		fencerv1.HolderTokenAnnotationPrefix+name, fencerv1.HolderLeaseIDAnnotationPrefix+name)
}

// annotatedFor lists the pods of namespace that carry the token or etcd
// lease ID annotation of Lease name, whatever their labels.
func (r *LeaseReconciler) annotatedFor(ctx context.Context, namespace, name string) ([]corev1.Pod, error) {
	var pods corev1.PodList
	if err := r.List(ctx, &pods, client.InNamespace(namespace), client.MatchingFields{indexPodLease: name}); err != nil {
		return nil, err
	}
	return pods.Items, nil
}

// union is the pods of the lists, each once (by UID).
func union(lists ...[]corev1.Pod) []*corev1.Pod {
	seen := map[string]bool{}
	var out []*corev1.Pod
	for _, pods := range lists {
		for i := range pods {
			if uid := string(pods[i].UID); !seen[uid] {
				seen[uid] = true
				out = append(out, &pods[i])
			}
		}
	}
	return out
}

// publishAfterStatus has the pods annotated once the status is written. A
// pod learns a token only after the status records it, so a manager that
// stops in between leaves no token in use that the status (and its check
// for an etcd restored from an old snapshot) does not know.
//
// Taking a token away reveals nothing, so the removals go first, before the
// status write: a status write refused again and again (an admission check
// of the cluster's own) must not leave an ex-holder reporting its token.
// They are best effort here; the pass after the status write makes them
// again and reports what failed.
func (r *LeaseReconciler) publishAfterStatus(ctx context.Context, out *outcome, lease *fencerv1.Lease, pods []corev1.Pod, g *etcdstore.Grant) {
	_ = r.publish(ctx, lease, pods, g, true)
	out.afterStatus = func(ctx context.Context) error { return r.publish(ctx, lease, pods, g, false) }
}
