package controllers

import (
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// handedBlocks remembers, per IDRange UID and pod UID, the block last given to a
// pod whose annotation the cache does not show yet: the patch may still be
// on its way back through the watch (the next reconcile lists pods from the
// cache), or it failed. Either way the pod is offered that block again, not
// a new one, so neither a lagging cache nor a pod whose patches are refused
// burns blocks. The block is covered by status.next and was claimed for
// this pod alone. A manager restart forgets it: a pod then skips at most
// one block. Keyed by the IDRange's UID, not its name: a range deleted and
// created again under the name (on another manager, while this one stood
// by) must not be offered blocks of the old range's sequence.
type handedBlocks struct {
	mu sync.Mutex
	m  map[types.UID]map[types.UID]string
}

func (h *handedBlocks) get(rng types.UID, uid types.UID) (string, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	v, ok := h.m[rng][uid]
	return v, ok
}

func (h *handedBlocks) put(rng types.UID, uid types.UID, block string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.m == nil {
		h.m = map[types.UID]map[types.UID]string{}
	}
	if h.m[rng] == nil {
		h.m[rng] = map[types.UID]string{}
	}
	h.m[rng][uid] = block
}

// prune forgets the pods that are gone or whose annotation (key) the cache
// shows as the block handed to them: from then on the annotation is the
// record. A pod that still shows another annotation (a forged or copied
// one the handed block replaces) keeps its block.
func (h *handedBlocks) prune(rng types.UID, pods []corev1.Pod, key string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	waiting := map[types.UID]string{}
	for i := range pods {
		waiting[pods[i].UID] = pods[i].Annotations[key]
	}
	for uid, block := range h.m[rng] {
		if shown, ok := waiting[uid]; !ok || shown == block {
			delete(h.m[rng], uid)
		}
	}
	if len(h.m[rng]) == 0 {
		delete(h.m, rng)
	}
}

func (h *handedBlocks) forget(rng types.UID) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.m, rng)
}

// ownBlocks remembers, per IDRange UID and pod UID, the block annotation
// found to be one this controller claimed for that pod (its claim record in
// etcd names it), so that each pod's annotation is read from etcd once per
// manager, not at every pass. A pod whose annotation changed is checked
// again.
type ownBlocks struct {
	mu sync.Mutex
	m  map[types.UID]map[types.UID]string
}

func (o *ownBlocks) is(rng, uid types.UID, block string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	v, ok := o.m[rng][uid]
	return ok && v == block
}

func (o *ownBlocks) add(rng, uid types.UID, block string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.m == nil {
		o.m = map[types.UID]map[types.UID]string{}
	}
	if o.m[rng] == nil {
		o.m[rng] = map[types.UID]string{}
	}
	o.m[rng][uid] = block
}

// prune forgets the pods that are gone.
func (o *ownBlocks) prune(rng types.UID, pods []corev1.Pod) {
	o.mu.Lock()
	defer o.mu.Unlock()
	present := map[types.UID]bool{}
	for i := range pods {
		present[pods[i].UID] = true
	}
	for uid := range o.m[rng] {
		if !present[uid] {
			delete(o.m[rng], uid)
		}
	}
	if len(o.m[rng]) == 0 {
		delete(o.m, rng)
	}
}

func (o *ownBlocks) forget(rng types.UID) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.m, rng)
}
