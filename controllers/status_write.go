package controllers

import (
	"context"
	"errors"
	"reflect"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
)

// apiClient is what a reconcile's writes go through: the manager's client,
// whose reads come from its cache, and live, an uncached reader that
// confirms what a write's answer says where the cache may be behind.
type apiClient struct {
	client.Client
	live client.Reader
}

// apiClientOf pairs c with live, or with c itself when live is nil (unit
// tests without an API server, where the cache confirms a NotFound).
func apiClientOf(c client.Client, live client.Reader) apiClient {
	if live == nil {
		return apiClient{c, c}
	}
	return apiClient{c, live}
}

// runPass is the skeleton of a reconcile, shared by the Lease and IDRange
// reconcilers: an object being deleted is finalized; otherwise it gets its
// finalizer (none if finalizer is ""), pass sets its status and returns the
// rest of the outcome, and finish writes the status once.
func runPass(ctx context.Context, c apiClient, rec events.EventRecorder, obj client.Object, finalizer string,
	finalize func(context.Context) (ctrl.Result, error), pass func(context.Context) (outcome, error)) (ctrl.Result, error) {
	if !obj.GetDeletionTimestamp().IsZero() {
		return finalize(ctx)
	}
	if finalizer != "" && controllerutil.AddFinalizer(obj, finalizer) {
		if err := c.Update(ctx, obj); err != nil {
			return c.requeueIfStale(ctx, obj, err)
		}
	}
	before := statusOf(obj.DeepCopyObject().(client.Object)).Addr().Interface()
	out, err := pass(ctx)
	if err != nil {
		return ctrl.Result{}, err
	}
	return finish(ctx, c, rec, obj, before, statusOf(obj).Addr().Interface(), out)
}

// dropFinalizer removes finalizer from obj once what it guarded is
// released. A pass that ran on a cache behind the API server may find the
// object gone already (an earlier pass removed the finalizer and the delete
// completed) or changed (another finalizer removed): a quiet retry, which
// finds nothing left to do, and no reconcile error.
func dropFinalizer(ctx context.Context, c apiClient, obj client.Object, finalizer string) (ctrl.Result, error) {
	if !controllerutil.RemoveFinalizer(obj, finalizer) {
		return ctrl.Result{}, nil
	}
	if err := c.Update(ctx, obj); err != nil {
		return c.requeueIfStale(ctx, obj, err)
	}
	return ctrl.Result{}, nil
}

// finish writes obj's status once, if it changed from before, and only then
// records the outcome's Events and runs its afterStatus.
func finish(ctx context.Context, c apiClient, rec events.EventRecorder, obj client.Object, before, after any, out outcome) (ctrl.Result, error) {
	if out.cacheBehind {
		return out.result, nil
	}
	if !equality.Semantic.DeepEqual(before, after) {
		if err := writeStatus(ctx, c.Client, obj, before); err != nil {
			if out.statusRefused != nil {
				out.statusRefused(ctx)
			}
			return c.requeueIfStale(ctx, obj, err)
		}
	}
	for _, e := range out.events {
		rec.Eventf(obj, nil, e.kind, e.reason, e.reason, "%s", e.note)
	}
	if out.afterStatus != nil {
		if err := out.afterStatus(ctx); err != nil {
			return retryWhenPodCopyBehind(ctx, out.result, err)
		}
	}
	return out.result, nil
}

// writeStatus writes obj's status. When the write conflicts only because
// the object's metadata changed meanwhile (a label, an annotation, a
// kubectl touch), the status this reconcile started from (before) is still
// the stored one, and its outcome still holds: the status is written onto
// the fresh object, so its Events are not lost with a retry that would find
// nothing left to do. A changed spec or status is a real conflict, and so
// is another object of the same name (deleted and created again): its
// generation and empty status can match before, but the outcome was
// computed for its predecessor, whose grant it must never show.
func writeStatus(ctx context.Context, c client.Client, obj client.Object, before any) error {
	uid := obj.GetUID() // before the write: a failed write may still change obj
	err := c.Status().Update(ctx, obj)
	// The reads come from the cache, which may not have the racing write
	// yet: a few short tries.
	for try := 0; try < 5 && conflictNaming(err, obj.GetName()); try++ {
		time.Sleep(time.Duration(try) * 20 * time.Millisecond)
		fresh, ok := obj.DeepCopyObject().(client.Object)
		if !ok || c.Get(ctx, client.ObjectKeyFromObject(obj), fresh) != nil {
			return err
		}
		if fresh.GetUID() != uid || fresh.GetGeneration() != obj.GetGeneration() || !equality.Semantic.DeepEqual(statusOf(fresh).Interface(), reflect.ValueOf(before).Elem().Interface()) {
			return err // the spec or the status moved on: reconcile again
		}
		statusOf(fresh).Set(statusOf(obj))
		if err = c.Status().Update(ctx, fresh); err == nil {
			obj.SetResourceVersion(fresh.GetResourceVersion())
		}
	}
	return err
}

// statusOf is the Status field of a Lease or IDRange.
func statusOf(obj client.Object) reflect.Value {
	return reflect.ValueOf(obj).Elem().FieldByName("Status")
}

// cacheCatchUp is how long a reconcile waits before it looks again when
// the API server has already deleted an object its cache still shows.
const cacheCatchUp = 100 * time.Millisecond

// requeueIfStale turns a write to obj, the object being reconciled, that
// found the cache behind into a quiet retry: a conflict on obj (it changed
// meanwhile), or obj deleted since the cache showed it, whose retry, once
// the cache has caught up, finds obj gone and does what the deletion asks
// (as the deletion's own event does too). Anything else is a failure,
// logged and retried with backoff, among them:
//   - a 409 from an admission webhook, which names no object: a webhook
//     of the user's own that refuses the controller's writes would refuse
//     every retry too (fencer's fencing webhooks never judge its own kinds);
//   - a CRD applied without its status subresource, which answers every
//     status write with a NotFound that names obj, while obj is there;
//   - an API version no longer served, or a deleted CRD: a bare 404 page,
//     which client-go names after obj too, but marks as a response the
//     server did not explain.
func (c apiClient) requeueIfStale(ctx context.Context, obj client.Object, err error) (ctrl.Result, error) {
	switch {
	case conflictNaming(err, obj.GetName()):
		return ctrl.Result{RequeueAfter: time.Millisecond}, nil
	case c.deletedMeanwhile(ctx, obj, err):
		return ctrl.Result{RequeueAfter: cacheCatchUp}, nil
	}
	return ctrl.Result{}, err
}

// deletedMeanwhile reports whether err, from a write to obj, is a NotFound
// that names obj, confirmed by an uncached read that finds no obj either.
func (c apiClient) deletedMeanwhile(ctx context.Context, obj client.Object, err error) bool {
	if !notFoundNaming(err, obj.GetName()) {
		return false
	}
	fresh := obj.DeepCopyObject().(client.Object)
	return notFoundNaming(c.live.Get(ctx, client.ObjectKeyFromObject(obj), fresh), obj.GetName())
}

// notFoundNaming reports whether err is the API server's own NotFound for
// the object called name.
func notFoundNaming(err error, name string) bool {
	return apierrors.IsNotFound(err) && serverStatusNaming(err, name)
}

// conflictNaming reports whether err is the API server's own conflict on
// the object called name: its storage refusing a stale resourceVersion, not
// an admission webhook's 409.
func conflictNaming(err error, name string) bool {
	return apierrors.IsConflict(err) && serverStatusNaming(err, name)
}

// serverStatusNaming reports whether err is a status the API server
// returned about the object called name: not a webhook's denial (which
// names no object) nor a 404 for a resource or path it does not serve
// (which client-go builds itself, with the cause UnexpectedServerResponse).
func serverStatusNaming(err error, name string) bool {
	var status apierrors.APIStatus
	if !errors.As(err, &status) || apierrors.HasStatusCause(err, metav1.CauseTypeUnexpectedServerResponse) {
		return false
	}
	d := status.Status().Details
	return d != nil && d.Name == name
}

// requeueOnConflict turns a write conflict (our cache was behind) into a
// quiet retry; other errors go to the workqueue's backoff, logged as
// reconcile errors.
func requeueOnConflict(err error) (ctrl.Result, error) {
	if apierrors.IsConflict(err) {
		return ctrl.Result{RequeueAfter: time.Millisecond}, nil
	}
	return ctrl.Result{}, err
}
