package webhook

import (
	"context"
	"fmt"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
)

// LeaseReader reads the Lease a fenced write names.
type LeaseReader interface {
	// Lease returns the Lease namespace/name, shared and read-only, or an
	// error that apierrors.IsNotFound recognizes.
	Lease(ctx context.Context, namespace, name string) (*fencerv1.Lease, error)
}

// LeaseView holds the Leases the manager's informer holds, as the
// informer's own objects: a review reads its Lease without the deep copy
// (status history and conditions included) that a cache Get makes. The
// objects are never written; an update replaces them.
type LeaseView struct {
	mu     sync.RWMutex
	leases map[types.NamespacedName]*fencerv1.Lease
}

// WatchLeases fills a LeaseView from informers' Lease informer, and keeps
// it current. Until the informer has synced, a Lease it has not delivered
// reads as NotFound; Checker then asks the apiserver.
func WatchLeases(ctx context.Context, informers cache.Informers) (*LeaseView, error) {
	inf, err := informers.GetInformer(ctx, &fencerv1.Lease{})
	if err != nil {
		return nil, fmt.Errorf("watching Leases for the webhook: %w", err)
	}
	v := &LeaseView{leases: map[types.NamespacedName]*fencerv1.Lease{}}
	_, err = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    v.put,
		UpdateFunc: func(_, obj any) { v.put(obj) },
		DeleteFunc: v.remove,
	})
	if err != nil {
		return nil, fmt.Errorf("watching Leases for the webhook: %w", err)
	}
	return v, nil
}

func (v *LeaseView) put(obj any) {
	l, ok := obj.(*fencerv1.Lease)
	if !ok {
		return
	}
	v.mu.Lock()
	v.leases[client.ObjectKeyFromObject(l)] = l
	v.mu.Unlock()
}

func (v *LeaseView) remove(obj any) {
	if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	l, ok := obj.(*fencerv1.Lease)
	if !ok {
		return
	}
	v.mu.Lock()
	delete(v.leases, client.ObjectKeyFromObject(l))
	v.mu.Unlock()
}

// Lease implements LeaseReader.
func (v *LeaseView) Lease(_ context.Context, namespace, name string) (*fencerv1.Lease, error) {
	v.mu.RLock()
	l := v.leases[types.NamespacedName{Namespace: namespace, Name: name}]
	v.mu.RUnlock()
	if l == nil {
		return nil, apierrors.NewNotFound(fencerv1.GroupVersion.WithResource("leases").GroupResource(), name)
	}
	return l, nil
}

// ReaderLeases reads Leases through a client.Reader, a copy each time.
type ReaderLeases struct{ client.Reader }

// Lease implements LeaseReader.
func (r ReaderLeases) Lease(ctx context.Context, namespace, name string) (*fencerv1.Lease, error) {
	l := &fencerv1.Lease{}
	if err := r.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, l); err != nil {
		return nil, err
	}
	return l, nil
}
