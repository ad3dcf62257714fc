package harness

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/test/e2e/history"
)

// startWatches records every version of the fenced ConfigMaps and every
// Lease status, from before the workload starts: it returns once both
// watches have listed what is there. A watch that cannot resume where it
// stopped (410 Gone) would leave a gap, and fails the run.
func (h *Harness) startWatches(ctx context.Context) error {
	var err error
	if h.objects, err = history.Create(filepath.Join(h.opts.Dir, "objects.jsonl")); err != nil {
		return err
	}
	if h.leases, err = history.Create(filepath.Join(h.opts.Dir, "leases.jsonl")); err != nil {
		return err
	}
	if h.faults, err = history.Create(filepath.Join(h.opts.Dir, "faults.jsonl")); err != nil {
		return err
	}
	wc, err := client.NewWithWatch(h.cfg, client.Options{Scheme: h.env.Scheme})
	if err != nil {
		return err
	}
	wctx, cancel := context.WithCancel(context.Background())
	h.stopWatch = cancel
	listed := make(chan error, 2)
	h.watchers.Go(func() {
		h.follow(wctx, wc, listed, &corev1.ConfigMapList{}, &h.seenCM, func(obj client.Object, typ watch.EventType) error {
			cm := obj.(*corev1.ConfigMap)
			// The fenced objects are cm-<lease>: one that lost its label
			// is recorded too, as the checker's evidence of a label
			// removal that was applied.
			unlabelled := cm.Labels[fencerv1.LeaseLabel] == ""
			if unlabelled && !strings.HasPrefix(cm.Name, "cm-") {
				return nil
			}
			// The record of the accepted write; the offer never stays on the object.
			tok, _ := strconv.ParseInt(cm.Annotations[fencerv1.WrittenTokenAnnotation], 10, 64)
			seq, _ := strconv.ParseInt(cm.Data["seq"], 10, 64)
			dataTok, _ := strconv.ParseInt(cm.Data["token"], 10, 64)
			return h.objects.Add(history.ObjectEvent{Name: cm.Name, ResourceVersion: rvOf(cm), Type: string(typ),
				Token: tok, Writer: cm.Data["writer"], Seq: seq, Hostile: cm.Annotations[history.HostileAnnotation], Unlabelled: unlabelled, DataToken: dataTok})
		})
	})
	h.watchers.Go(func() {
		h.follow(wctx, wc, listed, &fencerv1.LeaseList{}, &h.seenLease, func(obj client.Object, _ watch.EventType) error {
			l := obj.(*fencerv1.Lease)
			return h.leases.Add(history.LeaseEvent{Name: l.Name, ResourceVersion: rvOf(l), Token: l.Status.Token, Holder: l.Status.Holder, At: time.Now()})
		})
	})
	for range 2 {
		select {
		case err := <-listed:
			if err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// caughtUp waits until each history watch has delivered the newest version
// of every object it follows, so the histories are complete.
func (h *Harness) caughtUp(ctx context.Context) error {
	for _, f := range []struct {
		list client.ObjectList
		seen *atomic.Int64
	}{{&corev1.ConfigMapList{}, &h.seenCM}, {&fencerv1.LeaseList{}, &h.seenLease}} {
		if err := h.cl.List(ctx, f.list, client.InNamespace(Namespace)); err != nil {
			return err
		}
		var newest int64
		if err := meta.EachListItem(f.list, func(o runtime.Object) error {
			newest = max(newest, rvOf(o.(client.Object)))
			return nil
		}); err != nil {
			return err
		}
		deadline := time.Now().Add(30 * time.Second)
		for f.seen.Load() < newest {
			if time.Now().After(deadline) {
				return fmt.Errorf("the watch of %T delivered resourceVersion %d, but the newest object is at %d: the history is incomplete", f.list, f.seen.Load(), newest)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return nil
}

func rvOf(obj client.Object) int64 {
	n, _ := strconv.ParseInt(obj.GetResourceVersion(), 10, 64)
	return n
}

func (h *Harness) stopWatches() {
	if h.stopWatch != nil {
		h.stopWatch()
		h.watchers.Wait()
		h.stopWatch = nil
	}
}

// follow lists, records what the list holds, then watches from the list's
// resourceVersion, resuming each broken watch at the last version seen. It
// sends the list's outcome on listed. The listed objects are recorded as
// ADDED: a status written before the list (the managers' first grants, on a
// slow machine) is otherwise in neither the list's record nor the watch's,
// and a pod reporting the token it gave would read as holding a token the
// status never gave it.
func (h *Harness) follow(ctx context.Context, wc client.WithWatch, listed chan<- error, list client.ObjectList, seen *atomic.Int64, emit func(client.Object, watch.EventType) error) {
	fail := func(err error) {
		if ctx.Err() == nil {
			h.watchErr <- err
		}
	}
	err := wc.List(ctx, list, client.InNamespace(Namespace))
	if err == nil {
		err = meta.EachListItem(list, func(o runtime.Object) error {
			obj := o.(client.Object)
			seen.Store(max(seen.Load(), rvOf(obj)))
			return emit(obj, watch.Added)
		})
	}
	listed <- err
	if err != nil {
		return
	}
	rv := list.GetResourceVersion()
	for ctx.Err() == nil {
		w, err := wc.Watch(ctx, list, client.InNamespace(Namespace), &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true}})
		if err != nil {
			if ctx.Err() == nil {
				continue
			}
			return
		}
		for ev := range w.ResultChan() {
			switch ev.Type {
			case watch.Error:
				if st := apierrors.FromObject(ev.Object); apierrors.IsResourceExpired(st) || apierrors.IsGone(st) {
					fail(fmt.Errorf("watch of %T expired at rv %s: %w", list, rv, st))
					w.Stop()
					return
				}
				continue
			case watch.Bookmark:
			default:
				if err := emit(ev.Object.(client.Object), ev.Type); err != nil {
					fail(err)
				}
			}
			if obj, ok := ev.Object.(client.Object); ok && obj.GetResourceVersion() != "" {
				rv = obj.GetResourceVersion()
				seen.Store(rvOf(obj))
			}
		}
		w.Stop()
	}
}
