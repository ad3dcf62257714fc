package controllers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The pods both controllers serve: finding them, and writing the
// annotations through which they learn their tokens, blocks and slots.

// podsMatching lists the pods of namespace that ls (parsed: sel) matches.
// With a matchLabels pair it reads only the pods carrying that label (the
// smallest key, for a stable choice); the whole selector then filters them.
func podsMatching(ctx context.Context, c client.Reader, namespace string, ls *metav1.LabelSelector, sel labels.Selector) ([]corev1.Pod, error) {
	opts := []client.ListOption{client.InNamespace(namespace), client.MatchingLabelsSelector{Selector: sel}}
	if keys := slices.Sorted(maps.Keys(ls.MatchLabels)); len(keys) > 0 {
		opts = append(opts, client.MatchingFields{indexPodLabel: keys[0] + "=" + ls.MatchLabels[keys[0]]})
	}
	var pods corev1.PodList
	if err := c.List(ctx, &pods, opts...); err != nil {
		return nil, err
	}
	return pods.Items, nil
}

func podByUID(pods []corev1.Pod, uid string) *corev1.Pod {
	for i := range pods {
		if string(pods[i].UID) == uid {
			return &pods[i]
		}
	}
	return nil
}

// annotationsDiffer says whether pod's annotations among keys differ from
// want (a key absent from want is one the pod must not carry).
func annotationsDiffer(pod *corev1.Pod, want map[string]string, keys ...string) bool {
	for _, k := range keys {
		v, ok := want[k]
		cur, has := pod.Annotations[k]
		if (ok && (!has || cur != v)) || (!ok && has) {
			return true
		}
	}
	return false
}

// annotatePod sets the keys in want and removes the other keys named, with
// one merge patch, only when something differs.
func annotatePod(ctx context.Context, c client.Client, pod *corev1.Pod, want map[string]string, keys ...string) error {
	if !annotationsDiffer(pod, want, keys...) {
		return nil
	}
	return patchAnnotations(ctx, c, pod, want, keys...)
}

// patchAnnotations is annotatePod's merge patch. It names the pod's UID,
// so it applies only to the pod it was computed for: a pod deleted and
// created again under the same name meanwhile (a StatefulSet's, or one
// force-deleted) is a different pod, which must not receive the old one's
// token, block or slot. The apiserver refuses such a patch (a UID cannot
// change), and, as for a pod that is gone, nothing is written: the new
// pod's own events reconcile it.
func patchAnnotations(ctx context.Context, c client.Client, pod *corev1.Pod, want map[string]string, keys ...string) error {
	ann := make(map[string]*string, len(keys))
	for _, k := range keys {
		if v, ok := want[k]; ok {
			ann[k] = &v
		} else {
			ann[k] = nil // removes it
		}
	}
	data, err := json.Marshal(map[string]any{"metadata": map[string]any{"uid": pod.UID, "annotations": ann}})
	if err != nil {
		return err
	}
	err = c.Patch(ctx, pod, client.RawPatch(types.MergePatchType, data))
	if apierrors.IsNotFound(err) || podReplaced(err) {
		return nil
	}
	return err
}

// removeUnchanged removes keys from the pod's annotations only where they
// still hold the values this copy of the pod shows, with a JSON patch that
// tests each value (and the pod's UID) before it removes it. A copy from a
// cache behind the apiserver may show an older token where the pod now
// carries a live one: then the test fails, nothing is removed, and the
// error is errPodCopyBehind; a pass with a fresher copy decides.
func removeUnchanged(ctx context.Context, c client.Client, pod *corev1.Pod, keys ...string) error {
	ops := []map[string]any{{"op": "test", "path": "/metadata/uid", "value": pod.UID}}
	for _, k := range keys {
		if v, ok := pod.Annotations[k]; ok {
			path := "/metadata/annotations/" + jsonPointerEscape(k)
			ops = append(ops, map[string]any{"op": "test", "path": path, "value": v}, map[string]any{"op": "remove", "path": path})
		}
	}
	if len(ops) == 1 {
		return nil
	}
	data, err := json.Marshal(ops)
	if err != nil {
		return err
	}
	err = c.Patch(ctx, pod, client.RawPatch(types.JSONPatchType, data))
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case jsonPatchTestFailed(err):
		// The pod changed since this copy: a token published or removed,
		// the pod replaced.
		return podCopyBehind{err}
	}
	return err
}

// jsonPatchTestFailed reports whether err is kube-apiserver's answer to a
// JSON patch that did not apply: 422 Invalid and nothing more, neither
// the object nor a cause (its patch handler's applyJSPatch drops the patch
// library's message). removeUnchanged's patch can fail to apply only at a
// test. A ValidatingAdmissionPolicy's denial is 422 Invalid too, but it
// names the pod and carries the policy's message: a failure to report,
// not a copy to wait out.
func jsonPatchTestFailed(err error) bool {
	var status apierrors.APIStatus
	if !apierrors.IsInvalid(err) || !errors.As(err, &status) {
		return false
	}
	got := status.Status()
	bare := got.Details == nil || (got.Details.Name == "" && got.Details.Kind == "" && len(got.Details.Causes) == 0)
	return bare && got.Message == patchNotApplied.ErrStatus.Message
}

// patchNotApplied is the apiserver's answer to a JSON patch that does not
// apply, as jsonPatchTestFailed compares it.
var patchNotApplied = apierrors.NewGenericServerResponse(http.StatusUnprocessableEntity, "", schema.GroupResource{}, "", "", 0, false)

// errPodCopyBehind is removeUnchanged's refusal to remove what a pod may
// no longer carry: the pod changed since the cache's copy of it. Nothing
// is wrong: the pass runs again once the cache has the change
// (retryWhenPodCopyBehind), and decides on the fresher copy.
var errPodCopyBehind = errors.New("the pod changed since the cache's copy of it, so nothing was removed")

// podCopyBehind is errPodCopyBehind with the apiserver's answer.
type podCopyBehind struct{ answer error }

func (e podCopyBehind) Error() string        { return errPodCopyBehind.Error() + ": " + e.answer.Error() }
func (e podCopyBehind) Unwrap() error        { return e.answer }
func (e podCopyBehind) Is(target error) bool { return target == errPodCopyBehind }

// onlyPodCopyBehind reports whether every error err joins is a
// podCopyBehind: one failure of any other kind in it (another pod's
// patch, an etcd read) makes the whole a failure to report.
func onlyPodCopyBehind(err error) bool {
	switch e := err.(type) { //nolint:errorlint // it walks the wrapping itself, one level at a time
	case podCopyBehind:
		return true
	case interface{ Unwrap() []error }:
		errs := e.Unwrap()
		return len(errs) > 0 && !slices.ContainsFunc(errs, func(err error) bool { return !onlyPodCopyBehind(err) })
	case interface{ Unwrap() error }:
		return onlyPodCopyBehind(e.Unwrap())
	}
	return false
}

// retryWhenPodCopyBehind turns a pass's error made only of podCopyBehind
// refusals into a quiet retry in staleRetry (sooner if res asks). Any
// other error goes to the workqueue's backoff and the error log, with no
// Result (controller-runtime ignores one beside an error, and warns). A
// handover races its own pod patches, and a cache a moment behind them is
// no fault.
func retryWhenPodCopyBehind(ctx context.Context, res ctrl.Result, err error) (ctrl.Result, error) {
	if err == nil {
		return res, nil
	}
	if !onlyPodCopyBehind(err) {
		return ctrl.Result{}, err
	}
	ctrl.LoggerFrom(ctx).V(1).Info("removing pod annotations again once the cache has caught up", "reason", err.Error())
	if res.RequeueAfter <= 0 || res.RequeueAfter > staleRetry {
		res.RequeueAfter = staleRetry
	}
	return res, nil
}

// jsonPointerEscape escapes a map key for a JSON Pointer (RFC 6901): an
// annotation key's '/' would otherwise split the path.
func jsonPointerEscape(k string) string {
	return strings.ReplaceAll(strings.ReplaceAll(k, "~", "~0"), "/", "~1")
}

// podReplaced says whether err is the apiserver's refusal of a patch that
// names another UID than the stored pod's: the pod was replaced.
func podReplaced(err error) bool {
	var status apierrors.APIStatus
	if !apierrors.IsInvalid(err) || !errors.As(err, &status) || status.Status().Details == nil {
		return false
	}
	for _, cause := range status.Status().Details.Causes {
		if cause.Field == "metadata.uid" {
			return true
		}
	}
	return false
}

// podPatchesAtOnce bounds the pod patches one reconcile sends at once.
const podPatchesAtOnce = 8

// annotateEach gives each pod the annotations want(pod) among keys, with one
// patch for each pod whose annotations differ, trying every pod: one
// that cannot be patched keeps no other from its annotation. The patches go
// out together (up to podPatchesAtOnce): on a handover the old holder's
// removal and the new holder's token are independent writes, and the new
// holder should not wait for the old one's round trip. A pod that is to
// carry none of keys loses them only where it still carries what this copy
// of it shows (removeUnchanged): a copy older than a token published since
// must not take that token away.
func annotateEach(ctx context.Context, c client.Client, pods []*corev1.Pod, want func(*corev1.Pod) map[string]string, keys ...string) error {
	type change struct {
		pod  *corev1.Pod
		want map[string]string
	}
	var changes []change
	for _, pod := range pods {
		if w := want(pod); annotationsDiffer(pod, w, keys...) {
			changes = append(changes, change{pod, w})
		}
	}
	errs := make([]error, len(changes))
	slots := make(chan struct{}, podPatchesAtOnce)
	var wg sync.WaitGroup
	for i, ch := range changes {
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			if err := annotateOne(ctx, c, ch.pod, ch.want, keys...); err != nil {
				errs[i] = fmt.Errorf("annotating pod %s: %w", ch.pod.Name, err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// annotateOne is annotateEach's patch of one pod: a conditional removal
// when it is to carry none of keys, else a merge patch.
func annotateOne(ctx context.Context, c client.Client, pod *corev1.Pod, want map[string]string, keys ...string) error {
	if len(want) == 0 {
		return removeUnchanged(ctx, c, pod, keys...)
	}
	return patchAnnotations(ctx, c, pod, want, keys...)
}
