package lease

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// TestGrantEventsFoldOnlyExactRepeats: a Lease granted to w-a, then w-b,
// then w-a again has one Granted Event per pod, w-a's with a series of 2.
// client-go's recorder keys Events by object (resourceVersion included)
// and reason, whatever their notes say: each grant, coming with a status
// write, was an Event of its own, and with the resourceVersion left out
// but no digest of the note, the grant to w-b would be only a count on
// w-a's Event, under w-a's note.
func TestGrantEventsFoldOnlyExactRepeats(t *testing.T) {
	startController(t, "c1")
	ns := namespace(t)
	a := readyPod(t, ns, "w-a", "w")
	b := readyPod(t, ns, "w-b", "w")
	create(t, newLease(ns, "l", "w", 2))
	if st := heldBy(t, ns, "l"); st.Holder != "w-a" {
		t.Fatalf("first granted to %s, want the oldest Ready pod w-a", st.Holder)
	}
	setReady(t, a, false)
	heldBy(t, ns, "l", "w-a")
	setReady(t, a, true)
	setReady(t, b, false)
	heldBy(t, ns, "l", "w-b")

	eventually(t, 30*time.Second, "one Granted Event per pod, w-a's counted twice", func() error {
		var list eventsv1.EventList
		if err := k8s.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
			return err
		}
		var got []string
		for _, e := range list.Items {
			if e.Regarding.Name != "l" || e.Reason != "Granted" {
				continue
			}
			n := int32(1)
			if e.Series != nil {
				n = e.Series.Count
			}
			got = append(got, fmt.Sprintf("%s x%d", e.Note, n))
		}
		slices.Sort(got)
		if want := []string{"granted to w-a x2", "granted to w-b x1"}; !slices.Equal(got, want) {
			return fmt.Errorf("Granted Events (note x count): %q, want %q", got, want)
		}
		return nil
	})
}
