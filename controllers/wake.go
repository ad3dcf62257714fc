package controllers

import (
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/fencer-io/fencer/internal/etcdstore"
	"github.com/fencer-io/fencer/internal/renew"
)

// waker carries objects to reconcile from outside the informers (etcd watch
// events, lost keepalives, a new election term) into a controller's queue.
type waker[T any, P interface {
	*T
	client.Object
}] chan event.GenericEvent

func newWaker[T any, P interface {
	*T
	client.Object
}]() waker[T, P] {
	return make(waker[T, P], 1024)
}

// wake queues a reconcile of namespace/name.
func (w waker[T, P]) wake(namespace, name string) {
	var o P = new(T)
	o.SetNamespace(namespace)
	o.SetName(name)
	w <- event.GenericEvent{Object: o}
}

// source feeds the controller from the waker.
func (w waker[T, P]) source() source.Source {
	return source.Channel((chan event.GenericEvent)(w), &handler.EnqueueRequestForObject{})
}

// renewerWaking is the Renewer of a controller: a lost keepalive of a key
// wakes the object parse names.
func renewerWaking[T any, P interface {
	*T
	client.Object
}](store *etcdstore.Store, clk clock.Clock, w waker[T, P], parse func(key string) (namespace, name string, ok bool)) *renew.Renewer {
	return renew.New(store.Client(), clk, func(key string) {
		if ns, name, ok := parse(key); ok {
			w.wake(ns, name)
		}
	})
}
