package harness

import (
	"context"
	"net/http"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Readiness probing as a kubelet does it: every period, with a timeout,
// Ready after one success and not Ready after failureThreshold failures. A
// paused worker stops answering, so its pod goes not Ready and fencer moves
// its Leases, as in a real cluster.
const (
	probePeriod      = 500 * time.Millisecond
	probeTimeout     = 400 * time.Millisecond
	failureThreshold = 2
)

type kubelet struct {
	cl     client.Client
	logf   func(string, ...any)
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func newKubelet(cl client.Client, logf func(string, ...any)) *kubelet {
	ctx, cancel := context.WithCancel(context.Background())
	return &kubelet{cl: cl, logf: logf, ctx: ctx, cancel: cancel}
}

func (k *kubelet) stop() {
	k.cancel()
	k.wg.Wait()
}

// probe runs the readiness probe of pod against url until stopped.
func (k *kubelet) probe(pod *corev1.Pod, url string) {
	k.wg.Go(func() {
		hc := &http.Client{Timeout: probeTimeout}
		var reported *bool
		failures := 0
		tick := time.NewTicker(probePeriod)
		defer tick.Stop()
		for {
			resp, err := hc.Get(url)
			if err == nil {
				resp.Body.Close()
			}
			ok := err == nil && resp.StatusCode == http.StatusOK
			if ok {
				failures = 0
			} else {
				failures++
			}
			ready := ok || (failures < failureThreshold && reported != nil && *reported)
			if reported == nil || *reported != ready {
				if err := k.setReady(pod, ready); err == nil {
					reported = &ready
				} else if k.ctx.Err() == nil {
					k.logf("kubelet: %s Ready=%v: %v", pod.Name, ready, err)
				}
			}
			select {
			case <-k.ctx.Done():
				return
			case <-tick.C:
			}
		}
	})
}

func (k *kubelet) setReady(pod *corev1.Pod, ready bool) error {
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	for {
		p := &corev1.Pod{}
		if err := k.cl.Get(k.ctx, client.ObjectKeyFromObject(pod), p); err != nil {
			return err
		}
		p.Status.Phase = corev1.PodRunning
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: status, LastTransitionTime: metav1.Now()}}
		err := k.cl.Status().Update(k.ctx, p)
		if !apierrors.IsConflict(err) {
			return err
		}
	}
}
