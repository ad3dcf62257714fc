package eventkey

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
)

type recorded struct {
	regarding    corev1.ObjectReference
	action, note string
}

type capture struct{ got []recorded }

func (c *capture) Eventf(regarding, _ runtime.Object, _, _, action, note string, args ...any) {
	if len(args) != 1 || note != "%s" {
		panic("the note must be handed on formatted")
	}
	ref, ok := regarding.(*corev1.ObjectReference)
	if !ok {
		panic("the regarding object must be handed on as a reference")
	}
	c.got = append(c.got, recorded{*ref, action, args[0].(string)})
}

// TestOnlyExactRepeatsShareAKey: the same note about the same object gives
// the same reference and action, whatever its resourceVersion (the
// recorder folds it into a series); another note, another action.
func TestOnlyExactRepeatsShareAKey(t *testing.T) {
	var c capture
	rec := Distinct(&c, clientgoscheme.Scheme)
	pod := func(rv string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "l", Namespace: "ns", UID: "u", ResourceVersion: rv}}
	}
	rec.Eventf(pod("1"), nil, "Normal", "Granted", "Granted", "granted to %s", "a")
	rec.Eventf(pod("2"), nil, "Normal", "Granted", "Granted", "granted to %s", "a")
	rec.Eventf(pod("3"), nil, "Normal", "Granted", "Granted", "granted to %s", "b")
	if len(c.got) != 3 {
		t.Fatalf("recorded %d Events, want 3", len(c.got))
	}
	if c.got[0] != c.got[1] {
		t.Errorf("a repeat got %+v, then %+v: it would not join the series", c.got[0], c.got[1])
	}
	if c.got[0].action == c.got[2].action {
		t.Errorf("two notes share action %q: the second would be folded under the first note", c.got[0].action)
	}
	if r := c.got[0].regarding; r.Kind != "Pod" || r.Name != "l" || r.UID != "u" {
		t.Errorf("regarding %+v, want the pod", r)
	}
	if c.got[2].note != "granted to b" {
		t.Errorf("note %q, want the formatted note", c.got[2].note)
	}
	if a := Action("MemberLeaseReverted", "x"); len(a) > 128 {
		t.Errorf("action %q is over the API's 128 characters", a)
	}
}
