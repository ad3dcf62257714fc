package fence

import (
	"context"
	"errors"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

// denied is the error the apiserver returns when fencer's webhook refuses.
func denied(msg string) error {
	return &apierrors.StatusError{ErrStatus: metav1.Status{
		Status: metav1.StatusFailure, Code: 409, Reason: metav1.StatusReasonConflict,
		Message: `admission webhook "fenced.fencer.io" denied the request: ` + msg,
	}}
}

func TestAsStaleToken(t *testing.T) {
	for _, tc := range []struct {
		msg              string
		lease            string
		offered, current int64
	}{
		{"fencer: stale token 41 for lease default/report: current token is 42 (holder reporter-b)", "default/report", 41, 42},
		{"fencer: token 45 is not the current token of lease default/report: current token is 42 (holder b)", "default/report", 45, 42},
		{"fencer: forged token 999 for lease ns/l: no token above 500 has been issued", "ns/l", 999, 0},
		{"fencer: stale token 42 for lease ns/l: the object already carries token 43, written by a newer holder", "ns/l", 42, 0},
		{"fencer: missing fencing token for lease ns/l: set the annotation fencer.io/token to the holder's token (current token is 7, holder p)", "ns/l", 0, 7},
		{"fencer: lease ns/l has no holder, so no token is current; token 42 is refused until the lease is granted again", "ns/l", 42, 0},
	} {
		err := AsStaleToken(denied(tc.msg))
		var st *StaleTokenError
		if !errors.As(err, &st) || st.Lease != tc.lease || st.Offered != tc.offered || st.Current != tc.current {
			t.Errorf("%q:\n got %+v", tc.msg, st)
		}
	}
	optimistic := apierrors.NewConflict(schema.GroupResource{Resource: "configmaps"}, "x", fmt.Errorf("the object has been modified"))
	if err := AsStaleToken(optimistic); !apierrors.IsConflict(err) || errors.As(err, new(*StaleTokenError)) {
		t.Errorf("an optimistic-lock conflict became %v", err)
	}
	if AsStaleToken(nil) != nil {
		t.Error("nil became an error")
	}
}

type fixed Token

func (f fixed) Token(context.Context) (Token, error) { return Token(f), nil }

// TestClientStampsEveryWrite: the wrapper stamps the label and the current
// token on Create, Update and Patch, and turns denials into StaleTokenError.
func TestClientStampsEveryWrite(t *testing.T) {
	var seen []map[string]string
	record := func(obj client.Object) {
		seen = append(seen, map[string]string{"lease": obj.GetLabels()[LeaseLabel], "token": obj.GetAnnotations()[TokenAnnotation]})
	}
	base := fake.NewClientBuilder().WithInterceptorFuncs(interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			record(obj)
			return c.Create(ctx, obj, opts...)
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			record(obj)
			return denied("fencer: stale token 7 for lease ns/report: current token is 8 (holder b)")
		},
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			record(obj)
			return c.Patch(ctx, obj, patch, opts...)
		},
	}).Build()
	c := NewClient(base, fixed{Lease: "report", Value: 7})
	ctx := context.Background()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "out", Namespace: "ns"}}
	if err := c.Create(ctx, cm); err != nil {
		t.Fatal(err)
	}
	err := c.Update(ctx, cm)
	var st *StaleTokenError
	if !errors.As(err, &st) || st.Current != 8 {
		t.Fatalf("Update: %v, want a StaleTokenError with current 8", err)
	}
	orig := cm.DeepCopy()
	cm.Data = map[string]string{"k": "v"}
	if err := c.Patch(ctx, cm, client.MergeFrom(orig)); err != nil {
		t.Fatal(err)
	}
	for i, s := range seen {
		if s["lease"] != "report" || s["token"] != "7" {
			t.Errorf("write %d not stamped: %v", i, s)
		}
	}
	if len(seen) != 3 {
		t.Fatalf("%d writes seen", len(seen))
	}
}
