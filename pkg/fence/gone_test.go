package fence

import (
	"context"
	"errors"
	"os"
	"path/filepath"
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
		path := filepath.Join(t.TempDir(), "annotations")
		if err := os.WriteFile(path, []byte(`lease.fencer.io/report="9"`), 0o644); err != nil {
			t.Fatal(err)
		}
		l := statusLease("w-0", "me", 9)
		cli := fakeClient(l)
		src := Verified{Source: FileSource{Path: path, Lease: "report"}, Check: StatusHeld{Client: cli, Namespace: "ns", PodUID: "me", Interval: 10 * time.Millisecond}}
		started, done := make(chan Token, 1), make(chan error, 1)
		go func() {
			done <- RunExclusive(ctx, src, "report", time.Hour, func(ctx context.Context, tok Token) error {
				started <- tok
				<-ctx.Done()
				return ctx.Err()
			})
		}()
		if tok := <-started; tok.Value != 9 {
			t.Fatalf("ran with %+v", tok)
		}
		if err := cli.Delete(ctx, l); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			if !errors.Is(err, ErrLeaseLost) {
				t.Fatalf("RunExclusive = %v, want ErrLeaseLost", err)
			}
		case <-time.After(5 * time.Second):
			// Without the fix it ends only once no read confirmed the grant for 15 s.
			t.Fatal("RunExclusive kept running 5 s after the Lease was deleted")
		}
	})
}
