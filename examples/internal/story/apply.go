package story

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencer-io/fencer/test/support/manifest"
)

// apply server-side applies every object of a manifest file, as
// `kubectl apply --server-side -f file` would.
func apply(ctx context.Context, k client.Client, file string) error {
	objs, err := manifest.Read(file)
	if err != nil {
		return err
	}
	for _, u := range objs {
		if u.GetNamespace() == "" && u.GetKind() != "Namespace" {
			u.SetNamespace(Namespace)
		}
		if OnRealNode() && u.GetKind() == "Pod" {
			// The actors are these pods, created by Start on the real
			// node; a simulated pod of the same name would be deleted
			// under it by kwok, which deletes by name.
			podLabels[u.GetName()] = u.GetLabels()
			continue
		}
		if err := k.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner("fencer-story"), client.ForceOwnership); err != nil {
			return fmt.Errorf("applying %s %s: %w", u.GetKind(), u.GetName(), err)
		}
	}
	return nil
}

// waitReady waits until the pods are Ready: on kwok nodes they are
// simulated, and the Lease elects only Ready pods.
func waitReady(ctx context.Context, k client.Client, pods ...string) error {
	if OnRealNode() {
		return nil // Start creates them, and waits for each
	}
	deadline := time.Now().Add(60 * time.Second)
	for _, name := range pods {
		for {
			var p corev1.Pod
			err := k.Get(ctx, client.ObjectKey{Namespace: Namespace, Name: name}, &p)
			if err == nil && PodReady(&p) {
				break
			}
			if time.Now().After(deadline) {
				if err == nil {
					err = errors.New("its Ready condition is not True")
				}
				return fmt.Errorf("pod %s not Ready after 60 s (is `make dev` running?): %w", name, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	return nil
}

// PodReady tells whether p is Ready.
func PodReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
