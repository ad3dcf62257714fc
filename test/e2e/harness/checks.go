package harness

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
)

func (h *Harness) holderOf(ctx context.Context, lease string) (string, error) {
	l := &fencerv1.Lease{}
	if err := h.cl.Get(ctx, client.ObjectKey{Namespace: Namespace, Name: lease}, l); err != nil {
		return "", err
	}
	if l.Status.Holder == "" {
		return "", fmt.Errorf("lease %s has no holder", lease)
	}
	return l.Status.Holder, nil
}

// WaitHeld is the liveness check: after the faults healed, every Lease with
// a Ready candidate is held again, in etcd and in its status, within its TTL
// plus bound. It returns how long each Lease took.
func (h *Harness) WaitHeld(ctx context.Context, bound time.Duration) (map[string]time.Duration, error) {
	start := time.Now()
	took := map[string]time.Duration{}
	for _, want := range Leases {
		deadline := start.Add(time.Duration(want.Spec.TTLSeconds)*time.Second + bound)
		for {
			err := h.held(ctx, want.Name)
			if err == nil {
				took[want.Name] = time.Since(start)
				break
			}
			if time.Now().After(deadline) {
				return took, fmt.Errorf("lease %s not held %s after the faults healed: %w", want.Name, time.Since(start).Round(time.Millisecond), err)
			}
			sleep(ctx, 100*time.Millisecond)
		}
	}
	return took, nil
}

// held checks lease is held by a Ready pod, with the same token in etcd and
// in its status.
func (h *Harness) held(ctx context.Context, name string) error {
	l := &fencerv1.Lease{}
	if err := h.cl.Get(ctx, client.ObjectKey{Namespace: Namespace, Name: name}, l); err != nil {
		return err
	}
	if c := meta.FindStatusCondition(l.Status.Conditions, fencerv1.ConditionHeld); c == nil || c.Status != metav1.ConditionTrue {
		return fmt.Errorf("held condition %+v", c)
	}
	resp, err := h.etcd.Get(ctx, etcdkeys.LeaseKey(h.Prefix(), Namespace, name))
	if err != nil {
		return err
	}
	if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != l.Status.Token {
		return fmt.Errorf("status token %d does not match etcd (%d keys)", l.Status.Token, len(resp.Kvs))
	}
	pod := &corev1.Pod{}
	if err := h.cl.Get(ctx, client.ObjectKey{Namespace: Namespace, Name: l.Status.Holder}, pod); err != nil {
		return err
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			return nil
		}
	}
	return fmt.Errorf("holder %s is not Ready", pod.Name)
}

// workerClient authenticates as worker pod name (its bound token).
func (h *Harness) workerClient(name string) (client.Client, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(h.opts.Dir, "workers", name+".kubeconfig"))
	if err != nil {
		return nil, err
	}
	return client.New(cfg, client.Options{Scheme: h.env.Scheme})
}

// SecurityChecks: a pod offering the live token of a bindIdentity Lease it
// does not hold is refused; a workload allowed by RBAC to write Lease status
// is refused by the webhook; the managers, running with the generated role,
// were never refused by RBAC.
func (h *Harness) SecurityChecks(ctx context.Context) error {
	if err := h.impostorRefused(ctx); err != nil {
		return err
	}
	if err := h.statusForgeryRefused(ctx); err != nil {
		return err
	}
	logs, err := h.ManagerLogs()
	if err != nil {
		return err
	}
	if i := strings.Index(strings.ToLower(logs), "forbidden"); i >= 0 {
		return fmt.Errorf("a manager running with the generated role was refused by RBAC: …%s…", logs[max(0, i-300):min(len(logs), i+200)])
	}
	return nil
}

func (h *Harness) impostorRefused(ctx context.Context) error {
	l := &fencerv1.Lease{}
	if err := h.cl.Get(ctx, client.ObjectKey{Namespace: Namespace, Name: "beta"}, l); err != nil {
		return err
	}
	var impostor string
	for _, p := range h.pods {
		if p.Labels["group"] == "b" && p.Name != l.Status.Holder {
			impostor = p.Name
		}
	}
	cl, err := h.workerClient(impostor)
	if err != nil {
		return err
	}
	patch := fmt.Appendf(nil, `{"metadata":{"annotations":{"fencer.io/token":"%d"}},"data":{"writer":"impostor-%s"}}`, l.Status.Token, impostor)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cm-beta", Namespace: Namespace}}
	err = cl.Patch(ctx, cm, client.RawPatch(types.MergePatchType, patch))
	if err == nil {
		return fmt.Errorf("%s wrote cm-beta with %s's live token %d under bindIdentity", impostor, l.Status.Holder, l.Status.Token)
	}
	if !strings.Contains(err.Error(), "bindIdentity") && !strings.Contains(err.Error(), "stale token") {
		return fmt.Errorf("%s's write with %s's token was refused, but not for its identity: %w", impostor, l.Status.Holder, err)
	}
	return nil
}

func (h *Harness) statusForgeryRefused(ctx context.Context) error {
	cl, err := h.workerClient(h.pods[0].Name)
	if err != nil {
		return err
	}
	l := &fencerv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "alpha", Namespace: Namespace}}
	patch := []byte(`{"status":{"holder":"` + h.pods[0].Name + `","token":999999999}}`)
	err = cl.Status().Patch(ctx, l, client.RawPatch(types.MergePatchType, patch))
	if err == nil {
		return fmt.Errorf("worker %s rewrote Lease alpha's status", h.pods[0].Name)
	}
	if !strings.Contains(err.Error(), "only the fencer manager") {
		return fmt.Errorf("worker %s's status write was refused, but not by fencer's status guard (RBAC allows it): %w", h.pods[0].Name, err)
	}
	return nil
}
