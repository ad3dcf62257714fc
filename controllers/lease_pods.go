package controllers

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

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
// A pod carrying a token above both rev, the revision this pass read the
// grant at, and g's own token keeps it if etcd, read again, holds that
// very grant for that pod: it came after this pass (another replica's,
// while this one was paused or deposed without knowing it yet), and a
// pass that did not see it must neither take it away nor overwrite it
// with an older token. Any other token that high (forged, or left from an
// etcd since restored from an older snapshot) goes. Removals hold only if
// the pod still carries what this pass's copy of it shows (annotateEach).
func (r *LeaseReconciler) publish(ctx context.Context, lease *fencerv1.Lease, pods []corev1.Pod, g *etcdstore.Grant, rev int64) error {
	newest := rev
	if g != nil {
		newest = max(newest, g.Token)
	}
	later := r.laterGrants(ctx, lease)
	err := r.annotateFor(ctx, lease, pods, func(pod *corev1.Pod, tokenKey, idKey string) map[string]string {
		if grantedLater(pod, tokenKey, newest) && later.spare(lease, pod, tokenKey) {
			return pickAnnotations(pod, tokenKey, idKey)
		}
		want := map[string]string{}
		if holds(lease, g, pod) {
			want[tokenKey] = fencerv1.FormatToken(g.Token)
			if lease.Spec.Renewal == fencerv1.RenewalDirect {
				want[idKey] = strconv.FormatInt(int64(g.LeaseID), 10)
			}
		}
		return want
	})
	return errors.Join(err, later.err)
}

// removeReleased is the part of publish that needs no status write: it
// removes the Lease's annotations from every pod whose token etcd had
// released by revision rev, the revision this pass read the grant at,
// g's holder included (an earlier grant of its own, when it was granted
// again). It leaves g's own token on its holder, and a token above rev
// that etcd, read again, holds for that pod: that grant came after the
// read, and a pass that did not see it (a replica deposed without knowing
// it yet) must not take it from its holder. It never adds g's token: that waits for the status write, and
// the next pass whose status write succeeds publishes it. Each removal
// holds only if the pod still carries what this pass's copy of it shows
// (removeUnchanged): a copy from before this holder's new token arrived
// must not take that token away.
func (r *LeaseReconciler) removeReleased(ctx context.Context, lease *fencerv1.Lease, pods []corev1.Pod, g *etcdstore.Grant, rev int64) error {
	tokenKey := fencerv1.HolderTokenAnnotationPrefix + lease.Name
	idKey := fencerv1.HolderLeaseIDAnnotationPrefix + lease.Name
	annotated, err := r.annotatedFor(ctx, lease.Namespace, lease.Name)
	if err != nil {
		return err
	}
	later := r.laterGrants(ctx, lease)
	var errs []error
	for _, pod := range union(pods, annotated) {
		if (grantedLater(pod, tokenKey, rev) && later.spare(lease, pod, tokenKey)) ||
			(holds(lease, g, pod) && pod.Annotations[tokenKey] == fencerv1.FormatToken(g.Token)) {
			continue
		}
		if err := removeUnchanged(ctx, r.Client, pod, tokenKey, idKey); err != nil {
			errs = append(errs, fmt.Errorf("removing a released token from pod %s: %w", pod.Name, err))
		}
	}
	return errors.Join(append(errs, later.err)...)
}

// grantedLater says whether pod carries a token above newest, the newest
// token a pass knows of: one granted after that pass read etcd.
func grantedLater(pod *corev1.Pod, tokenKey string, newest int64) bool {
	tok, err := fencerv1.ParseToken(pod.Annotations[tokenKey])
	return err == nil && tok > newest
}

// laterGrants tells, for a pod that carries a token above any its pass
// knows of, whether etcd, read again, holds that very grant for that pod.
// It reads etcd once, at the first such pod (they are rare). A failed
// read spares every such token and keeps the error (err): taking a live
// holder's token away while etcd cannot say is what sparing guards
// against, and the pass runs again.
type laterGrants struct {
	read func() (*etcdstore.Grant, error)
	once sync.Once
	g    *etcdstore.Grant
	err  error
}

func (r *LeaseReconciler) laterGrants(ctx context.Context, lease *fencerv1.Lease) *laterGrants {
	return &laterGrants{read: func() (*etcdstore.Grant, error) {
		g, _, err := r.Store.ReadGrant(ctx, lease.Namespace, lease.Name)
		return g, err
	}}
}

// spare says whether pod keeps the token it carries under tokenKey.
func (l *laterGrants) spare(lease *fencerv1.Lease, pod *corev1.Pod, tokenKey string) bool {
	l.once.Do(func() {
		if l.g, l.err = l.read(); l.err != nil {
			l.err = fmt.Errorf("reading the grant again, for a token above the pass's: %w", l.err)
		}
	})
	return l.err != nil || isLiveGrantOf(l.g, lease, pod, tokenKey)
}

// isLiveGrantOf says whether g, read from etcd, is lease's grant to pod,
// with the token pod carries.
func isLiveGrantOf(g *etcdstore.Grant, lease *fencerv1.Lease, pod *corev1.Pod, tokenKey string) bool {
	return g != nil && !g.Unissued && (g.LeaseUID == "" || g.LeaseUID == string(lease.UID)) &&
		g.Holder == pod.Name && g.HolderUID == string(pod.UID) && pod.Annotations[tokenKey] == fencerv1.FormatToken(g.Token)
}

// pickAnnotations is pod's present values of keys, for a pod a pass leaves
// as it is.
func pickAnnotations(pod *corev1.Pod, keys ...string) map[string]string {
	out := map[string]string{}
	for _, k := range keys {
		if v, ok := pod.Annotations[k]; ok {
			out[k] = v
		}
	}
	return out
}

// holds reports whether pod is g's holder and gets its token by annotation.
func holds(lease *fencerv1.Lease, g *etcdstore.Grant, pod *corev1.Pod) bool {
	return g != nil && lease.Spec.TokenDelivery != fencerv1.DeliveryLeaseStatus && pod.Name == g.Holder && string(pod.UID) == g.HolderUID
}

// annotateFor sets the Lease's annotations on the candidates and on every
// pod that carries them to what want returns for each.
func (r *LeaseReconciler) annotateFor(ctx context.Context, lease *fencerv1.Lease, pods []corev1.Pod, want func(pod *corev1.Pod, tokenKey, idKey string) map[string]string) error {
	tokenKey := fencerv1.HolderTokenAnnotationPrefix + lease.Name
	idKey := fencerv1.HolderLeaseIDAnnotationPrefix + lease.Name
	annotated, err := r.annotatedFor(ctx, lease.Namespace, lease.Name)
	if err != nil {
		return err
	}
	return annotateEach(ctx, r.Client, union(pods, annotated), func(pod *corev1.Pod) map[string]string {
		return want(pod, tokenKey, idKey)
	}, tokenKey, idKey)
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
// Taking a token away reveals nothing, so if the status write fails, the
// tokens etcd had released by rev are removed all the same: a status write
// refused again and again (an admission check of the cluster's own) must
// not leave an ex-holder reporting its token. On the usual path the
// removals and the new holder's token go out together after the status
// write, so a handover waits for no extra round trip.
func (r *LeaseReconciler) publishAfterStatus(out *outcome, lease *fencerv1.Lease, pods []corev1.Pod, g *etcdstore.Grant, rev int64) {
	out.afterStatus = func(ctx context.Context) error { return r.publish(ctx, lease, pods, g, rev) }
	out.statusRefused = func(ctx context.Context) { _ = r.removeReleased(ctx, lease, pods, g, rev) }
}
