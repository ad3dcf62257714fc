package controllers

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func TestHandedBlocks(t *testing.T) {
	const key = "idrange.fencer.io/ids"
	rng := types.UID("range-uid")
	var h handedBlocks
	h.put(rng, "a", "block=1-10")
	h.put(rng, "b", "block=11-20")
	h.put(rng, "c", "block=21-30")
	h.put(rng, "d", "block=31-40")
	pods := []corev1.Pod{
		{ObjectMeta: metav1.ObjectMeta{UID: "a"}},                                                     // still waiting
		{ObjectMeta: metav1.ObjectMeta{UID: "b", Annotations: map[string]string{key: "block=11-20"}}}, // the cache shows it
		// c is gone
		{ObjectMeta: metav1.ObjectMeta{UID: "d", Annotations: map[string]string{key: "block=1-10"}}}, // a copied block the handed one replaces
	}
	h.prune(rng, pods, key)
	if v, ok := h.get(rng, "a"); !ok || v != "block=1-10" {
		t.Errorf("a waiting pod's block was forgotten: %q %v", v, ok)
	}
	if v, ok := h.get(rng, "d"); !ok || v != "block=31-40" {
		t.Errorf("a pod still showing a copied block lost the block that replaces it: %q %v", v, ok)
	}
	for _, uid := range []types.UID{"b", "c"} {
		if v, ok := h.get(rng, uid); ok {
			t.Errorf("pod %s: still remembers %q", uid, v)
		}
	}
	if v, ok := h.get("recreated-range-uid", "a"); ok {
		t.Errorf("a range recreated under the name is offered the old range's block %q", v)
	}
	h.forget(rng)
	if _, ok := h.get(rng, "a"); ok {
		t.Error("forget kept a block")
	}
}

func TestOwnBlocks(t *testing.T) {
	rng := types.UID("range-uid")
	var o ownBlocks
	o.put(rng, "a", "block=1-10")
	o.put(rng, "b", "block=11-20")
	if !o.is(rng, "a", "block=1-10") {
		t.Error("a checked block is not remembered")
	}
	if o.is(rng, "a", "block=11-20") {
		t.Error("a changed annotation counts as checked")
	}
	if o.is("recreated-range-uid", "a", "block=1-10") {
		t.Error("a range recreated under the name shares the old range's checks")
	}
	o.markForeign(rng, "a", "block=500-509")
	o.markForeign(rng, "b", "block=500-509")
	if !o.foreign(rng, "a", "block=500-509") || o.foreign(rng, "a", "block=1-10") {
		t.Error("foreign does not say what was found foreign")
	}
	o.prune(rng, []corev1.Pod{{ObjectMeta: metav1.ObjectMeta{UID: "a"}}}) // b is gone
	if !o.foreign(rng, "a", "block=500-509") || o.foreign(rng, "b", "block=500-509") {
		t.Error("prune kept a gone pod's foreign block or dropped a present one's")
	}
	if !o.is(rng, "a", "block=1-10") || o.is(rng, "b", "block=11-20") {
		t.Error("prune kept a gone pod or dropped a present one")
	}
	o.forget(rng)
	if o.is(rng, "a", "block=1-10") || o.foreign(rng, "a", "block=500-509") {
		t.Error("forget kept a check")
	}
}
