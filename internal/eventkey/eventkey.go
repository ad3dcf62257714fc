// Package eventkey decides which Events are one Event: exact repeats join
// a series, and every other Event is its own.
//
// client-go's events.k8s.io recorder folds an Event into the series of an
// earlier one when their type, reason, action, reporter, regarding and
// related objects match, whatever their notes say, for six minutes after
// the last: the later Event only raises the earlier one's count, under the
// earlier note. Two things follow. A reference to the regarding object
// carries its resourceVersion, which every status write changes, so a
// controller's Events about an object it keeps writing never fold, and a
// Lease failing over every few seconds posts an Event each time. And when
// the resourceVersion does not change (a webhook's refusals), a second
// refusal of another write folds into the first, and its own facts are
// lost. Distinct refers to the regarding object without its
// resourceVersion, and adds a digest of the note to the action: an Event
// joins a series exactly when its object, reason and note repeat word for
// word, and such a repeat costs the apiserver at most one count update.
package eventkey

import (
	"fmt"
	"hash/fnv"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/tools/reference"
)

// Distinct wraps rec so that Events with different notes never share a
// series, and Events that repeat one do, whatever the object's
// resourceVersion. scheme names the kinds of the objects Events regard.
func Distinct(rec events.EventRecorder, scheme *runtime.Scheme) events.EventRecorder {
	return distinct{rec, scheme}
}

type distinct struct {
	rec    events.EventRecorder
	scheme *runtime.Scheme
}

// Eventf implements events.EventRecorder.
func (d distinct) Eventf(regarding, related runtime.Object, eventtype, reason, action, note string, args ...any) {
	msg := fmt.Sprintf(note, args...)
	if ref, err := reference.GetReference(d.scheme, regarding); err == nil {
		ref.ResourceVersion = ""
		regarding = ref
	}
	d.rec.Eventf(regarding, related, eventtype, reason, Action(action, msg), "%s", msg)
}

// Action is the action an Event with note is recorded under: the given
// action and the note's digest, well within the API's 128 characters for
// any action of ours.
func Action(action, note string) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(note))
	return fmt.Sprintf("%s-%08x", action, h.Sum32())
}
