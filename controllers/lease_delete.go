package controllers

import (
	"context"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/internal/metrics"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
)

// finalize releases the Lease's grant and its pod annotations, then lets
// the Lease go.
func (r *LeaseReconciler) finalize(ctx context.Context, lease *fencerv1.Lease) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(lease, fencerv1.LeaseFinalizer) {
		return ctrl.Result{}, nil
	}
	if res, err := r.releaseAll(ctx, client.ObjectKeyFromObject(lease)); err != nil || !res.IsZero() {
		return res, err
	}
	controllerutil.RemoveFinalizer(lease, fencerv1.LeaseFinalizer)
	return ctrl.Result{}, r.Update(ctx, lease)
}

// gone releases what a Lease that no longer exists left behind (releaseAll).
// finalize does this for a Lease deleted with fencer's finalizer; a Lease
// whose finalizer was removed by hand (as docs/install.md says to do after
// an uninstall), or deleted while no manager ran, comes here. The cache may
// not have seen a Lease just created, so the apiserver confirms the Lease
// is gone before anything is released.
func (r *LeaseReconciler) gone(ctx context.Context, name types.NamespacedName) (ctrl.Result, error) {
	if r.APIReader != nil {
		err := r.APIReader.Get(ctx, name, &fencerv1.Lease{})
		switch {
		case err == nil:
			return ctrl.Result{RequeueAfter: 100 * time.Millisecond}, nil // the cache has yet to see it
		case !apierrors.IsNotFound(err):
			return ctrl.Result{}, err
		}
	}
	return r.releaseAll(ctx, name)
}

// releaseAll ends everything a deleted Lease held: its grant (conditional
// delete and revoke, so its holder's Hold and WatchHeld end), its renewal,
// its grant marker, the annotations of every pod that carries them, and
// what the reconciler remembers of it. A zero Result means all is done.
func (r *LeaseReconciler) releaseAll(ctx context.Context, name types.NamespacedName) (ctrl.Result, error) {
	if _, err := r.Elector.Term(); err != nil {
		return ctrl.Result{RequeueAfter: time.Second}, nil
	}
	key := etcdkeys.LeaseKey(r.Store.Prefix(), name.Namespace, name.Name)
	g, err := r.Store.GetGrant(ctx, name.Namespace, name.Name)
	if err != nil {
		return ctrl.Result{}, err
	}
	if g != nil {
		lease := &fencerv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: name.Namespace, Name: name.Name}}
		if err := r.endGrant(ctx, lease, g); err != nil {
			return ctrl.Result{}, err
		}
		metrics.LeaseReleases.WithLabelValues(string(fencerv1.TenureDeleted)).Inc()
		ctrl.LoggerFrom(ctx).Info("released the grant of a deleted Lease", "holder", g.Holder, "token", g.Token)
	}
	r.Renewer.Stop(key)
	if err := r.Store.ForgetLease(ctx, name.Namespace, name.Name); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.unpublish(ctx, name.Namespace, name.Name); err != nil {
		return ctrl.Result{}, err
	}
	r.mem.forget(key)
	return ctrl.Result{}, nil
}
