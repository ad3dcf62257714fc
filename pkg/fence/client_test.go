package fence

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
)

// denied is the error the apiserver returns when fencer's webhook refuses:
// a message for people and the causes the SDK reads.
func denied(reason fencerv1.DenialReason, offered, recorded, current, holder string) error {
	return &apierrors.StatusError{ErrStatus: metav1.Status{
		Status: metav1.StatusFailure, Code: 409, Reason: metav1.StatusReasonConflict,
		// The message is deliberately unlike fencer's: the SDK must not read it.
		Message: `admission webhook "record.fencer.io" denied the request: anything at all`,
		Details: &metav1.StatusDetails{Causes: []metav1.StatusCause{
			{Type: fencerv1.CauseReason, Message: string(reason)},
			{Type: fencerv1.CauseLease, Message: "ns/report"},
			{Type: fencerv1.CauseOfferedToken, Message: offered},
			{Type: fencerv1.CauseRecordedToken, Message: recorded},
			{Type: fencerv1.CauseCurrentToken, Message: current},
			{Type: fencerv1.CauseHolder, Message: holder},
		}},
	}}
}

func TestAsStaleTokenReadsCauses(t *testing.T) {
	err := AsStaleToken(denied(fencerv1.DenialBelowLive, "41", "40", "42", "reporter-b"))
	var st *StaleTokenError
	if !errors.As(err, &st) {
		t.Fatalf("got %v", err)
	}
	want := StaleTokenError{Reason: fencerv1.DenialBelowLive, Lease: "ns/report", Offered: 41, Recorded: 40, Current: 42, Holder: "reporter-b", Message: st.Message, Err: st.Err}
	if *st != want {
		t.Fatalf("got %+v\nwant %+v", *st, want)
	}
	if !apierrors.IsConflict(err) {
		t.Error("the StaleTokenError hides the apiserver's 409")
	}
	if err := AsStaleToken(denied(fencerv1.DenialMissingToken, "", "", "0", "")); !errors.As(err, &st) || st.Reason != fencerv1.DenialMissingToken || st.Offered != 0 || st.Current != 0 {
		t.Fatalf("missing token: %+v", st)
	}
	optimistic := apierrors.NewConflict(schema.GroupResource{Resource: "configmaps"}, "x", fmt.Errorf("the object has been modified"))
	if err := AsStaleToken(optimistic); !apierrors.IsConflict(err) || errors.As(err, new(*StaleTokenError)) {
		t.Errorf("an optimistic-lock conflict became %v", err)
	}
	// A 409 whose message looks like fencer's but has no causes is not fencer's.
	lookalike := &apierrors.StatusError{ErrStatus: metav1.Status{Code: 409, Reason: metav1.StatusReasonConflict, Message: "fencer: stale token 41 for lease ns/l"}}
	if errors.As(AsStaleToken(lookalike), new(*StaleTokenError)) {
		t.Error("a message without causes was parsed")
	}
	if AsStaleToken(nil) != nil {
		t.Error("nil became an error")
	}
}

// sent records what each write put on the wire.
type sent struct {
	verb  string
	lease string
	token string
}

func recordingClient(t *testing.T, seen *[]sent) client.Client {
	t.Helper()
	fromObj := func(verb string, obj client.Object) {
		*seen = append(*seen, sent{verb, obj.GetLabels()[LeaseLabel], obj.GetAnnotations()[TokenAnnotation]})
	}
	return fake.NewClientBuilder().WithInterceptorFuncs(interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			fromObj("create", obj)
			return c.Create(ctx, obj, opts...)
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			fromObj("update", obj)
			return denied(fencerv1.DenialBelowLive, "7", "", "8", "b")
		},
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			// What matters is the patch body, not obj: that is what the apiserver merges.
			data, err := patch.Data(obj)
			if err != nil {
				return err
			}
			var body struct {
				Metadata metav1.ObjectMeta `json:"metadata"`
			}
			if err := json.Unmarshal(data, &body); err != nil {
				t.Fatalf("patch body %s: %v", data, err)
			}
			*seen = append(*seen, sent{"patch " + string(patch.Type()), body.Metadata.Labels[LeaseLabel], body.Metadata.Annotations[TokenAnnotation]})
			return nil
		},
		Apply: func(ctx context.Context, c client.WithWatch, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
			data, _ := json.Marshal(obj)
			var body struct {
				Metadata metav1.ObjectMeta `json:"metadata"`
			}
			if err := json.Unmarshal(data, &body); err != nil {
				t.Fatalf("apply body %s: %v", data, err)
			}
			*seen = append(*seen, sent{"apply", body.Metadata.Labels[LeaseLabel], body.Metadata.Annotations[TokenAnnotation]})
			return nil
		},
	}).Build()
}

// TestClientStampsEveryWrite: every write path that can carry the token
// carries the tenure's token in what it sends, including a merge patch whose
// original already had the same token (so a plain diff would drop it) and a
// raw patch the caller wrote by hand.
func TestClientStampsEveryWrite(t *testing.T) {
	var seen []sent
	c := NewClient(recordingClient(t, &seen), Token{Lease: "report", Value: 7})
	ctx := context.Background()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "out", Namespace: "ns"}}
	if err := c.Create(ctx, cm); err != nil {
		t.Fatal(err)
	}
	var st *StaleTokenError
	if err := c.Update(ctx, cm); !errors.As(err, &st) || st.Current != 8 {
		t.Fatalf("Update: %v, want a StaleTokenError with current 8", err)
	}
	orig := cm.DeepCopy() // already stamped with 7: a plain diff leaves the token out
	cm.Data = map[string]string{"k": "v"}
	for _, p := range []client.Patch{
		client.MergeFrom(orig),
		client.StrategicMergeFrom(orig),
		client.RawPatch(types.MergePatchType, []byte(`{"data":{"k":"raw"}}`)),
		client.RawPatch(types.StrategicMergePatchType, []byte(`{"metadata":{"annotations":{"fencer.io/token":"1"}}}`)),
	} {
		if err := c.Patch(ctx, cm, p); err != nil {
			t.Fatalf("Patch %s: %v", p.Type(), err)
		}
	}
	if err := c.Apply(ctx, corev1ac.ConfigMap("out", "ns").WithData(map[string]string{"k": "applied"})); err != nil {
		t.Fatal(err)
	}
	if len(seen) != 7 {
		t.Fatalf("%d writes seen: %+v", len(seen), seen)
	}
	for _, s := range seen {
		if s.lease != "report" || s.token != "7" {
			t.Errorf("%s sent lease %q token %q, want report and 7", s.verb, s.lease, s.token)
		}
	}
}

// TestClientRefusesTokenlessWrites: writes that cannot carry a token fail
// with ErrTokenless and never reach the apiserver.
func TestClientRefusesTokenlessWrites(t *testing.T) {
	reached := 0
	base := fake.NewClientBuilder().WithInterceptorFuncs(interceptor.Funcs{
		Delete: func(context.Context, client.WithWatch, client.Object, ...client.DeleteOption) error {
			reached++
			return nil
		},
		SubResourceUpdate: func(context.Context, client.Client, string, client.Object, ...client.SubResourceUpdateOption) error {
			reached++
			return nil
		},
		SubResourcePatch: func(context.Context, client.Client, string, client.Object, client.Patch, ...client.SubResourcePatchOption) error {
			reached++
			return nil
		},
	}).Build()
	c := NewClient(base, Token{Lease: "report", Value: 7})
	ctx := context.Background()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "out", Namespace: "ns"}}
	for name, err := range map[string]error{
		"Delete":               c.Delete(ctx, cm),
		"DeleteAllOf":          c.DeleteAllOf(ctx, cm),
		"Status().Update":      c.Status().Update(ctx, cm),
		"Status().Patch":       c.Status().Patch(ctx, cm, client.MergeFrom(cm)),
		"SubResource().Update": c.SubResource("scale").Update(ctx, cm),
		"JSON patch":           c.Patch(ctx, cm, client.RawPatch(types.JSONPatchType, []byte(`[]`))),
	} {
		if !errors.Is(err, ErrTokenless) {
			t.Errorf("%s: %v, want ErrTokenless", name, err)
		}
	}
	if reached != 0 {
		t.Fatalf("%d tokenless writes reached the apiserver", reached)
	}
}

// TestTxnRefusesNonPositiveTokens: token 0 would match an absent key (its
// CreateRevision is 0), so it is refused before any I/O: the nil client
// would panic if the transaction were sent.
func TestTxnRefusesNonPositiveTokens(t *testing.T) {
	for _, v := range []int64{0, -1} {
		_, err := NewTxn(nil, "/fencer", "ns", Token{Lease: "report", Value: v}).Commit(context.Background())
		if !errors.Is(err, ErrNoToken) {
			t.Errorf("token %d: %v, want ErrNoToken", v, err)
		}
		if _, err := Compare("/fencer", "ns", Token{Lease: "report", Value: v}); !errors.Is(err, ErrNoToken) {
			t.Errorf("Compare with token %d: %v, want ErrNoToken", v, err)
		}
	}
}
