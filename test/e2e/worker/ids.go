package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/pkg/idgen"
	"github.com/fencer-io/fencer/test/e2e/history"
)

// ownAnnotation reads this worker's pod's annotation key through the API
// ("" if absent).
func (w *worker) ownAnnotation(ctx context.Context, key string) (string, error) {
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	p := &corev1.Pod{}
	if err := w.kube.Get(rctx, client.ObjectKey{Namespace: w.namespace, Name: w.pod}, p); err != nil {
		return "", err
	}
	return p.Annotations[key], nil
}

// snowflakeLoop issues snowflake IDs on the slot of the Slots IDRange
// annotated on this worker's pod, as a workload does, and records them
// for the checker's duplicate count. A lost slot (paused past its TTL,
// relabelled out of the range) starts over with whatever slot the pod is
// annotated with next.
func (w *worker) snowflakeLoop(ctx context.Context) {
	for ctx.Err() == nil {
		gen := w.startSnowflake(ctx)
		if gen == nil {
			sleep(ctx, 500*time.Millisecond)
			continue
		}
		w.issueSnowflakes(ctx, gen)
		gen.Close()
	}
}

func (w *worker) startSnowflake(ctx context.Context) *idgen.Snowflake {
	ann, err := w.ownAnnotation(ctx, fencerv1.IDRangeAnnotationPrefix+w.slotRange)
	if err != nil || ann == "" {
		return nil
	}
	slot, token, err := idgen.ParseSlot(ann)
	if err != nil {
		return nil
	}
	nctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	gen, err := idgen.NewSnowflake(nctx, w.etcd, idgen.SnowflakeOptions{Prefix: w.prefix, Namespace: w.namespace, Name: w.slotRange,
		Slot: slot, Token: token, PodUID: types.UID(w.podUID)})
	if err != nil {
		return nil
	}
	return gen
}

// issueSnowflakes issues IDs in batches until the generator stops.
func (w *worker) issueSnowflakes(ctx context.Context, gen *idgen.Snowflake) {
	for ctx.Err() == nil {
		var ids []int64
		for range 20 {
			nctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			id, err := gen.Next(nctx)
			cancel()
			if err != nil {
				w.recordSnowflakes(ids)
				if errors.Is(err, idgen.ErrSlotLost) || errors.As(err, new(*idgen.ClockRollbackError)) {
					return
				}
				sleep(ctx, 100*time.Millisecond)
				ids = nil
				continue
			}
			ids = append(ids, id)
		}
		w.recordSnowflakes(ids)
		sleep(ctx, 100*time.Millisecond)
	}
}

func (w *worker) recordSnowflakes(ids []int64) {
	if len(ids) > 0 {
		w.record(history.Attempt{Kind: history.KindSnowflake, IDs: ids})
	}
}

// otherPodsAnnotation returns another worker pod's value of annotation
// key, for the hostile copies ("" when no other pod has one).
func (w *worker) otherPodsAnnotation(ctx context.Context, key string) (string, string) {
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var pods corev1.PodList
	if err := w.kube.List(rctx, &pods, client.InNamespace(w.namespace)); err != nil {
		return "", ""
	}
	for _, p := range pods.Items {
		if v := p.Annotations[key]; v != "" && p.Name != w.pod {
			return p.Name, v
		}
	}
	return "", ""
}

// copiedSlot starts a generator on another pod's slot annotation, as a
// pod carrying a copy of it would. It must be refused; if it is not, the
// IDs it issues are recorded, and the checker finds them twice.
func (w *worker) copiedSlot(ctx context.Context, a *history.Attempt) (tried bool, err error) {
	owner, ann := w.otherPodsAnnotation(ctx, fencerv1.IDRangeAnnotationPrefix+w.slotRange)
	slot, token, perr := idgen.ParseSlot(ann)
	if owner == "" || perr != nil {
		return false, nil
	}
	a.Target, a.Token = fmt.Sprintf("%s slot %d (copied from %s)", w.slotRange, slot, owner), token
	nctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	gen, err := idgen.NewSnowflake(nctx, w.etcd, idgen.SnowflakeOptions{Prefix: w.prefix, Namespace: w.namespace, Name: w.slotRange,
		Slot: slot, Token: token, PodUID: types.UID(w.podUID)})
	if err != nil {
		return true, err
	}
	defer gen.Close()
	var ids []int64
	for range 50 {
		if id, err := gen.Next(nctx); err == nil {
			ids = append(ids, id)
		}
	}
	w.recordSnowflakes(ids)
	return true, nil
}

// forgedBlock consumes a block annotation this pod was never handed: one
// forged across every block, or another pod's, copied. Both must be
// refused.
func (w *worker) forgedBlock(ctx context.Context, a *history.Attempt, copied bool) (tried bool, err error) {
	ann := "block=1-4611686018427387903"
	a.Target = w.idRange + " " + ann
	if copied {
		owner, v := w.otherPodsAnnotation(ctx, fencerv1.IDRangeAnnotationPrefix+w.idRange)
		if owner == "" {
			return false, nil
		}
		ann, a.Target = v, fmt.Sprintf("%s %s (copied from %s)", w.idRange, v, owner)
	}
	nctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = idgen.ConsumeBlock(nctx, w.etcd, w.prefix, w.namespace, w.idRange, ann, types.UID(w.podUID))
	return true, err
}

// idRefusalReason names why an ID hostile attempt was refused.
func idRefusalReason(err error) string {
	switch {
	case errors.Is(err, idgen.ErrSlotOfAnotherPod), errors.Is(err, idgen.ErrSlotLost), errors.Is(err, idgen.ErrBlockNotClaimed), errors.Is(err, idgen.ErrBlockConsumed):
		return history.ReasonFenced
	case errors.Is(err, context.DeadlineExceeded):
		return history.ReasonTimeout
	}
	// status.FromError finds a gRPC status wrapped by idgen's messages too.
	if s, ok := status.FromError(err); ok && s.Code() == codes.Unavailable {
		return history.ReasonEtcdUnavailable
	}
	return "" // unexplained: the checker fails the run
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
