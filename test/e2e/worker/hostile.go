package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/test/e2e/history"
)

// hostileLease is the Lease whose objects the hostile writes target: policy
// Current without bindIdentity, so no token but the live one, and no
// identity, may write them. (beta binds tokenless writes to its holder,
// who may make them legitimately.)
const hostileLease = "alpha"

// The hostile writes: what kubectl, a careless operator, a stale pod or a
// forger can send, and the SDK never would. Each must be refused.
var hostileModes = []string{
	"merge-no-token", // kubectl patch --type=merge without the token
	"apply-no-token", // a server-side apply that leaves the token out
	"label-remove",   // kubectl label fencer.io/lease-
	"annotate",       // kubectl annotate, no token
	"forge-future",   // a token far above any issued
	"forged-record",  // fencer.io/written-token set by hand
	"old-token",      // a token of an earlier tenure this worker saw
	"scale",          // kubectl scale of the fenced Deployment
	"status",         // a /status write of the fenced Deployment
	"delete",         // kubectl delete of the fenced ConfigMap
	"delete-deployment",
}

// hostileLoop sends one hostile write every interval, each mode in turn
// from a random start, until ctx ends.
func (w *worker) hostileLoop(ctx context.Context, every time.Duration) {
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	for i := rng.IntN(len(hostileModes)); ctx.Err() == nil; i++ {
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
		w.ensureDeployment(ctx)
		w.hostile(ctx, hostileModes[i%len(hostileModes)])
	}
}

// seen returns the tokens of lease this worker has read, oldest first.
func (w *worker) seen(lease string) []int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]int64(nil), w.tokens[lease]...)
}

// saw records a token of lease the worker read.
func (w *worker) saw(lease string, tok int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if ts := w.tokens[lease]; len(ts) == 0 || ts[len(ts)-1] != tok {
		w.tokens[lease] = append(ts, tok)
	}
}

func (w *worker) hostile(ctx context.Context, mode string) {
	hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cm, dep := "cm-"+hostileLease, "dep-"+hostileLease
	a := history.Attempt{Kind: history.KindHostile, Mode: mode, Lease: hostileLease, Target: cm}
	patch := func(pt types.PatchType, body string) error {
		obj := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: cm, Namespace: w.namespace}}
		return w.kube.Patch(hctx, obj, client.RawPatch(pt, []byte(body)))
	}
	seen := w.seen(hostileLease)
	var newest int64
	for _, t := range seen {
		newest = max(newest, t)
	}
	var err error
	switch mode {
	case "merge-no-token":
		err = patch(types.MergePatchType, fmt.Sprintf(`{"data":{"writer":"hostile-%s"}}`, w.pod))
	case "apply-no-token":
		err = w.kube.Apply(hctx, corev1ac.ConfigMap(cm, w.namespace).WithLabels(map[string]string{fencerv1.LeaseLabel: hostileLease}).
			WithData(map[string]string{"writer": "hostile-" + w.pod}), client.FieldOwner("hostile"), client.ForceOwnership)
	case "label-remove":
		err = patch(types.StrategicMergePatchType, `{"metadata":{"labels":{"fencer.io/lease":null}}}`)
	case "annotate":
		err = patch(types.StrategicMergePatchType, fmt.Sprintf(`{"metadata":{"annotations":{"hostile":%q}}}`, w.pod))
	case "forge-future":
		a.Token = newest + 1_000_000_000
		err = patch(types.MergePatchType, fmt.Sprintf(`{"metadata":{"annotations":{"fencer.io/token":"%d"}},"data":{"writer":"hostile-%s"}}`, a.Token, w.pod))
	case "forged-record":
		a.Token = newest
		err = patch(types.MergePatchType, fmt.Sprintf(`{"metadata":{"annotations":{"fencer.io/written-token":"%d"}},"data":{"writer":"hostile-%s"}}`, newest, w.pod))
	case "old-token":
		var older []int64 // below the newest seen, so below the live token
		for _, t := range seen {
			if t < newest {
				older = append(older, t)
			}
		}
		if len(older) == 0 {
			return // no earlier tenure seen yet
		}
		a.Token = older[rand.IntN(len(older))]
		err = patch(types.MergePatchType, fmt.Sprintf(`{"metadata":{"annotations":{"fencer.io/token":"%d"}},"data":{"writer":"hostile-%s"}}`, a.Token, w.pod))
	case "scale":
		a.Target = dep
		d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: dep, Namespace: w.namespace}}
		err = w.kube.SubResource("scale").Update(hctx, d, client.WithSubResourceBody(&autoscalingv1.Scale{
			ObjectMeta: metav1.ObjectMeta{Name: dep, Namespace: w.namespace}, Spec: autoscalingv1.ScaleSpec{Replicas: rand.Int32N(5) + 2}}))
	case "status":
		a.Target = dep
		d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: dep, Namespace: w.namespace}}
		err = w.kube.Status().Patch(hctx, d, client.RawPatch(types.MergePatchType, []byte(`{"status":{"observedGeneration":99}}`)))
	case "delete":
		err = w.kube.Delete(hctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: cm, Namespace: w.namespace}})
	case "delete-deployment":
		a.Target = dep
		err = w.kube.Delete(hctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: dep, Namespace: w.namespace}})
	}
	if ctx.Err() != nil || apierrors.IsNotFound(err) {
		return // shutting down, or the target is not there yet: nothing was tried
	}
	a.OK = err == nil
	if err != nil {
		a.Reason, a.Message = apiReason(err), err.Error()
	}
	w.record(a)
}

// ensureDeployment creates the fenced Deployment the scale and status
// writes target, with this worker's newest token (refused unless live).
func (w *worker) ensureDeployment(ctx context.Context) {
	seen := w.seen(hostileLease)
	if len(seen) == 0 {
		return
	}
	name := "dep-" + hostileLease
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := w.kube.Get(cctx, client.ObjectKey{Namespace: w.namespace, Name: name}, &appsv1.Deployment{}); !apierrors.IsNotFound(err) {
		return
	}
	labels := map[string]string{"app": "hostile-target"}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: w.namespace,
			Labels:      map[string]string{fencerv1.LeaseLabel: hostileLease},
			Annotations: map[string]string{fencerv1.TokenAnnotation: fencerv1.FormatToken(seen[len(seen)-1])}},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}}},
		},
	}
	_ = w.kube.Create(cctx, d) // a legitimate write; refused unless the token is live
}
