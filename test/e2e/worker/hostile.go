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
	"copied-slot",    // a snowflake generator on another pod's slot annotation
	"forged-block",   // a block annotation spanning every block
	"copied-block",   // another pod's block annotation
	"relabel-holder", // this pod, holding alpha, relabelled out of its selector for a while
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
	switch mode {
	case "copied-slot", "forged-block", "copied-block":
		w.hostileIDs(ctx, mode)
		return
	case "relabel-holder":
		w.relabelHolder(ctx)
		return
	}
	hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cm, dep := "cm-"+hostileLease, "dep-"+hostileLease
	a := history.Attempt{Kind: history.KindHostile, Mode: mode, Lease: hostileLease, Target: cm}
	patch := func(pt types.PatchType, body string) error {
		obj := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: cm, Namespace: w.namespace}}
		return w.kube.Patch(hctx, obj, client.RawPatch(pt, []byte(body)))
	}
	seen := w.seen(hostileLease)
	writer := history.HostileWriterPrefix + w.pod
	var newest int64
	for _, t := range seen {
		newest = max(newest, t)
	}
	var err error
	switch mode {
	case "merge-no-token":
		err = patch(types.MergePatchType, fmt.Sprintf(`{"data":{"writer":%q}}`, writer))
	case "apply-no-token":
		err = w.kube.Apply(hctx, corev1ac.ConfigMap(cm, w.namespace).WithLabels(map[string]string{fencerv1.LeaseLabel: hostileLease}).
			WithData(map[string]string{"writer": writer}), client.FieldOwner("hostile"), client.ForceOwnership)
	case "label-remove":
		err = patch(types.StrategicMergePatchType, `{"metadata":{"labels":{"fencer.io/lease":null}}}`)
	case "annotate":
		err = patch(types.StrategicMergePatchType, fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, history.HostileAnnotation, w.pod))
	case "forge-future":
		a.Token = newest + 1_000_000_000
		err = patch(types.MergePatchType, fmt.Sprintf(`{"metadata":{"annotations":{"fencer.io/token":"%d"}},"data":{"writer":%q}}`, a.Token, writer))
	case "forged-record":
		a.Token = newest
		err = patch(types.MergePatchType, fmt.Sprintf(`{"metadata":{"annotations":{"fencer.io/written-token":"%d"}},"data":{"writer":%q}}`, newest, writer))
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
		err = patch(types.MergePatchType, fmt.Sprintf(`{"metadata":{"annotations":{"fencer.io/token":"%d"}},"data":{"writer":%q}}`, a.Token, writer))
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

// hostileIDs uses an ID annotation this pod was never handed; the SDK
// must refuse it.
func (w *worker) hostileIDs(ctx context.Context, mode string) {
	if w.slotRange == "" || w.idRange == "" {
		return
	}
	a := history.Attempt{Kind: history.KindHostile, Mode: mode}
	var tried bool
	var err error
	switch mode {
	case "copied-slot":
		tried, err = w.copiedSlot(ctx, &a)
	default:
		tried, err = w.forgedBlock(ctx, &a, mode == "copied-block")
	}
	if !tried || ctx.Err() != nil {
		return
	}
	a.OK = err == nil
	if err != nil {
		a.Reason, a.Message = idRefusalReason(err), err.Error()
	}
	w.record(a)
}

// relabelHolder relabels this worker's own pod out of alpha's selector
// while it holds alpha, as a careless operator would, and puts the label
// back after relabelFor. The pod must lose its tenure and its annotation:
// its reports of the token (writeLoop) must stop within the checker's
// bound. One relabel at a time per worker.
func (w *worker) relabelHolder(ctx context.Context) {
	if !w.relabelling.CompareAndSwap(false, true) {
		return
	}
	l := &fencerv1.Lease{}
	gctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	err := w.kube.Get(gctx, client.ObjectKey{Namespace: w.namespace, Name: hostileLease}, l)
	cancel()
	if err != nil || l.Status.Holder != w.pod || w.setApp(ctx, "relabelled") != nil {
		w.relabelling.Store(false)
		return
	}
	w.record(history.Attempt{Kind: history.KindRelabel, Lease: hostileLease, Target: w.pod, Token: l.Status.Token, OK: true})
	go func() {
		defer w.relabelling.Store(false)
		sleep(ctx, relabelFor)
		// Put it back even while shutting down, so the pod is whole again.
		for try := 0; try < 20 && w.setApp(context.Background(), "worker") != nil; try++ {
			time.Sleep(500 * time.Millisecond)
		}
	}()
}

// relabelFor is longer than the checker's bound on stale reports, so a pod
// that kept its annotation while relabelled would be counted.
const relabelFor = 25 * time.Second

func (w *worker) setApp(ctx context.Context, app string) error {
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: w.pod, Namespace: w.namespace}}
	return w.kube.Patch(pctx, pod, client.RawPatch(types.MergePatchType, fmt.Appendf(nil, `{"metadata":{"labels":{"app":%q}}}`, app)))
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
