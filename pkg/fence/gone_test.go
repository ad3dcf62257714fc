package fence

import (
	"context"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// A deleted Lease or pod holds nothing: a Lease's grant goes with it (a
// workload scaled down, kubectl delete), and a pod force-deleted while
// cut off is replaced. Every source and check that reads them through the
// API must report the loss, not keep the last token as if the read had
// only failed for a while.
func TestADeletedObjectHoldsNothing(t *testing.T) {
	ctx := context.Background()
	pod := func() *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "w-0", Namespace: "ns", UID: "me",
			Annotations: map[string]string{TokenAnnotationPrefix + "report": "9"}}}
	}
	for _, c := range []struct {
		name   string
		object func() client.Object
		src    func(client.Client) Source
	}{
		{"LeaseSource", func() client.Object { return statusLease("w-0", "me", 9) },
			func(c client.Client) Source {
				return LeaseSource{Client: c, Namespace: "ns", Lease: "report", Pod: "w-0", UID: "me"}
			}},
		{"PodSource", func() client.Object { return pod() },
			func(c client.Client) Source {
				return PodSource{Client: c, Namespace: "ns", Pod: "w-0", UID: "me", Lease: "report"}
			}},
	} {
		t.Run(c.name, func(t *testing.T) {
			obj := c.object()
			cli := fakeClient(obj)
			src := c.src(cli)
			wctx, cancel := context.WithCancel(ctx)
			defer cancel()
			ch := Watch(wctx, src, "report", 10*time.Millisecond)
			if tok := <-ch; tok.Value != 9 {
				t.Fatalf("first token %+v, want 9", tok)
			}
			if err := cli.Delete(ctx, obj); err != nil {
				t.Fatal(err)
			}
			_, err := src.Token(ctx)
			if !errors.Is(err, ErrNotHolder) || !apierrors.IsNotFound(err) {
				t.Fatalf("Token after the deletion = %v, want ErrNotHolder wrapping the NotFound", err)
			}
			select {
			case tok := <-ch:
				if tok.Value != 0 {
					t.Fatalf("after the deletion Watch sent %+v, want the zero token", tok)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("10 s after the deletion, Watch still reports token 9")
			}
		})
	}
	t.Run("StatusHeld", func(t *testing.T) {
		l := statusLease("w-0", "me", 9)
		cli := fakeClient(l)
		src := Verified{Source: FileSource{Path: annotationsFile(t, 9), Lease: "report"}, Check: StatusHeld{Client: cli, Namespace: "ns", PodUID: "me", Interval: 10 * time.Millisecond}}
		done := runExclusive(t, src, 9)
		if err := cli.Delete(ctx, l); err != nil {
			t.Fatal(err)
		}
		// Within 5 s: a read that only failed would count it lost after 15.
		wantLost(t, done, 5*time.Second, "the Lease was deleted")
	})
}
