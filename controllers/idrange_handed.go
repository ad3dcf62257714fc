package controllers

import (
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// podBlocks is a block annotation remembered per IDRange UID and pod UID,
// safe for concurrent passes. Keyed by the IDRange's UID, not its name: a
// range deleted and created again under the name (on another manager,
// while this one stood by) shares nothing with the old range.
type podBlocks struct {
	mu sync.Mutex
	m  map[types.UID]map[types.UID]string
}

func (p *podBlocks) get(rng, uid types.UID) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	v, ok := p.m[rng][uid]
	return v, ok
}

func (p *podBlocks) put(rng, uid types.UID, block string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m = map[types.UID]map[types.UID]string{}
	}
	if p.m[rng] == nil {
		p.m[rng] = map[types.UID]string{}
	}
	p.m[rng][uid] = block
}

// retain keeps only the pods of rng for which keep says so.
func (p *podBlocks) retain(rng types.UID, keep func(uid types.UID, block string) bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for uid, block := range p.m[rng] {
		if !keep(uid, block) {
			delete(p.m[rng], uid)
		}
	}
	if len(p.m[rng]) == 0 {
		delete(p.m, rng)
	}
}

func (p *podBlocks) forget(rng types.UID) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.m, rng)
}

// keepRanges forgets every range for which live says no.
func (p *podBlocks) keepRanges(live func(rng types.UID) bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for rng := range p.m {
		if !live(rng) {
			delete(p.m, rng)
		}
	}
}

// handedBlocks remembers the block last given to a pod whose annotation the
// cache does not show yet: the patch may still be on its way back through
// the watch (the next reconcile lists pods from the cache), or it failed.
// Either way the pod is offered that block again, not a new one, so
// neither a lagging cache nor a pod whose patches are refused burns
// blocks. The block is covered by status.next and was claimed for this pod
// alone. A manager restart forgets it: a pod then skips at most one block.
type handedBlocks struct{ podBlocks }

// prune forgets the pods that are gone or whose annotation (key) the cache
// shows as the block handed to them: from then on the annotation is the
// record. A pod that still shows another annotation (a forged or copied
// one the handed block replaces) keeps its block.
func (h *handedBlocks) prune(rng types.UID, pods []corev1.Pod, key string) {
	shown := map[types.UID]string{}
	for i := range pods {
		shown[pods[i].UID] = pods[i].Annotations[key]
	}
	h.retain(rng, func(uid types.UID, block string) bool {
		v, ok := shown[uid]
		return ok && v != block
	})
}

// ownBlocks remembers the block annotation found to be one this controller
// claimed for the pod (its claim record in etcd names it), and the last one
// found not to be, so that each annotation a pod shows is read from etcd
// once per manager, not at every pass.
type ownBlocks struct {
	podBlocks
	notOwn podBlocks
}

func (o *ownBlocks) is(rng, uid types.UID, block string) bool {
	v, ok := o.get(rng, uid)
	return ok && v == block
}

// foreign says whether block was found not to be the pod's.
func (o *ownBlocks) foreign(rng, uid types.UID, block string) bool {
	v, ok := o.notOwn.get(rng, uid)
	return ok && v == block
}

func (o *ownBlocks) markForeign(rng, uid types.UID, block string) { o.notOwn.put(rng, uid, block) }

// prune forgets the pods that are gone.
func (o *ownBlocks) prune(rng types.UID, pods []corev1.Pod) {
	present := map[types.UID]bool{}
	for i := range pods {
		present[pods[i].UID] = true
	}
	keep := func(uid types.UID, _ string) bool { return present[uid] }
	o.retain(rng, keep)
	o.notOwn.retain(rng, keep)
}

func (o *ownBlocks) forget(rng types.UID) {
	o.podBlocks.forget(rng)
	o.notOwn.forget(rng)
}

func (o *ownBlocks) keepRanges(live func(rng types.UID) bool) {
	o.podBlocks.keepRanges(live)
	o.notOwn.keepRanges(live)
}

// rangeNames remembers the UID this process last passed over under each
// IDRange name, so that the memory of a range deleted and created again
// under its name, with no pass between that found it gone (it was
// finalized on another manager, or its finalizer removed by hand), is
// dropped at the new range's first pass rather than kept for ever.
type rangeNames struct {
	mu sync.Mutex
	m  map[types.NamespacedName]types.UID
}

// replaced records uid under name, and returns the UID it replaces, ""
// if none.
func (n *rangeNames) replaced(name types.NamespacedName, uid types.UID) types.UID {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.m == nil {
		n.m = map[types.NamespacedName]types.UID{}
	}
	old := n.m[name]
	n.m[name] = uid
	if old == uid {
		return ""
	}
	return old
}

// keepRanges forgets every name whose range live says is gone.
func (n *rangeNames) keepRanges(live func(rng types.UID) bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for name, uid := range n.m {
		if !live(uid) {
			delete(n.m, name)
		}
	}
}
