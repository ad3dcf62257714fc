package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	v1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/internal/etcdstore"
)

type fakeLive struct {
	live etcdstore.Live
	err  error
}

func (f fakeLive) Lookup(context.Context, string, string) (etcdstore.Live, error) {
	return f.live, f.err
}

func newFence(t testing.TB, live LiveLookup) *Fence {
	t.Helper()
	s := runtime.NewScheme()
	utilruntime.Must(v1.AddToScheme(s))
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(testLease(v1.PolicyCurrent, false)).Build()
	return &Fence{Leases: c, Live: live}
}

func obj(lease, tok string) []byte {
	m := metav1.ObjectMeta{Name: "cm", Namespace: "default", Labels: map[string]string{}, Annotations: map[string]string{}}
	if lease != "" {
		m.Labels[LeaseLabel] = lease
	}
	if tok != "" {
		m.Annotations[TokenAnnotation] = tok
	}
	raw, _ := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": m})
	return raw
}

func request(op admissionv1.Operation, object, old []byte) admission.Request {
	r := admission.Request{}
	r.UID = "1"
	r.Operation = op
	r.Namespace = "default"
	r.Name = "cm"
	r.Kind = metav1.GroupVersionKind{Version: "v1", Kind: "ConfigMap"}
	r.Object.Raw = object
	r.OldObject.Raw = old
	return r
}

func TestHandle(t *testing.T) {
	f := newFence(t, fakeLive{live: held(42, 50)})
	cases := []struct {
		name string
		req  admission.Request
		code int32 // 0: allowed
		msg  string
	}{
		{"create with the live token", request(admissionv1.Create, obj("report", "42"), nil), 0, ""},
		{"create with a stale token", request(admissionv1.Create, obj("report", "41"), nil), 409, "stale token 41 for lease default/report: current token is 42 (holder reporter-b)"},
		{"create unfenced", request(admissionv1.Create, obj("", ""), nil), 0, ""},
		{"update lowering the object's token", request(admissionv1.Update, obj("report", "42"), obj("report", "43")), 409, "the object already carries token 43"},
		{"update with the live token", request(admissionv1.Update, obj("report", "42"), obj("report", "41")), 0, ""},
		{"label removal with a stale token", request(admissionv1.Update, obj("", "41"), obj("report", "41")), 409, "stale token 41 for lease default/report"},
		{"label removal without a token", request(admissionv1.Update, obj("", ""), obj("report", "42")), 409, "missing fencing token for lease default/report"},
		{"label removal with the live token", request(admissionv1.Update, obj("", "42"), obj("report", "42")), 0, ""},
		{"label change", request(admissionv1.Update, obj("other", "42"), obj("report", "42")), 409, `fencer.io/lease cannot change from "report" to "other"`},
		{"label added: old token of no lease is not compared", request(admissionv1.Update, obj("report", "42"), obj("", "99")), 0, ""},
		{"delete of an object last written under the live token", request(admissionv1.Delete, nil, obj("report", "42")), 0, ""},
		{"delete of an object last written under a stale token", request(admissionv1.Delete, nil, obj("report", "41")), 409, "stale token 41"},
		{"unknown lease", request(admissionv1.Create, obj("ghost", "42"), nil), 409, "lease default/ghost does not exist"},
		{"malformed object JSON", request(admissionv1.Create, []byte("{not json"), nil), 400, "fencer: cannot read the object"},
		{"update without the old object", request(admissionv1.Update, obj("report", "42"), nil), 400, "UPDATE needs the object and the old object"},
		{"connect is not checked", request(admissionv1.Connect, nil, nil), 0, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp := f.Handle(context.Background(), tc.req)
			if tc.code == 0 {
				if !resp.Allowed {
					t.Fatalf("refused: %+v", resp.Result)
				}
				return
			}
			if resp.Allowed || resp.Result.Code != tc.code || !strings.Contains(resp.Result.Message, tc.msg) {
				t.Fatalf("got allowed=%v %+v\nwant %d containing %q", resp.Allowed, resp.Result, tc.code, tc.msg)
			}
		})
	}
}

func TestLookupFailureRefusesWith503(t *testing.T) {
	f := newFence(t, fakeLive{err: errors.New("context deadline exceeded")})
	resp := f.Handle(context.Background(), request(admissionv1.Create, obj("report", "42"), nil))
	if resp.Allowed || resp.Result.Code != 503 || !strings.Contains(resp.Result.Message, "cannot read the live token of lease default/report from etcd (context deadline exceeded)") {
		t.Fatalf("got %+v", resp.Result)
	}
}

// serve posts body to the webhook over HTTP, as the apiserver would.
func serve(t testing.TB, f *Fence, body []byte) *httptest.ResponseRecorder {
	wh := &admission.Webhook{Handler: f}
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, Path, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	wh.ServeHTTP(rec, req)
	return rec
}

func TestServeHTTPAnswersEveryBody(t *testing.T) {
	f := newFence(t, fakeLive{live: held(42, 50)})
	review := admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"}}
	r := request(admissionv1.Create, obj("report", "41"), nil)
	review.Request = &r.AdmissionRequest
	raw, _ := json.Marshal(review)
	rec := serve(t, f, raw)
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil || out.Response == nil {
		t.Fatalf("no AdmissionReview back: %v %s", err, rec.Body.String())
	}
	if out.Response.Allowed || out.Response.Result.Code != 409 || out.Response.UID != "1" {
		t.Fatalf("response %+v", out.Response)
	}
}

// FuzzServeHTTP: any request body gets an HTTP answer (an AdmissionReview or
// an error status), never a panic.
func FuzzServeHTTP(f *testing.F) {
	review := admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"}}
	r := request(admissionv1.Update, obj("report", "42"), obj("report", "43"))
	review.Request = &r.AdmissionRequest
	good, _ := json.Marshal(review)
	f.Add(good)
	f.Add([]byte(`{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{"uid":"x","operation":"DELETE"}}`))
	f.Add([]byte(`{"kind":"Pod"}`))
	f.Add([]byte(`{`))
	f.Add(bytes.Repeat([]byte(`[`), 100000))
	fence := &Fence{Live: fakeLive{live: held(42, 50)}}
	s := runtime.NewScheme()
	utilruntime.Must(v1.AddToScheme(s))
	fence.Leases = fake.NewClientBuilder().WithScheme(s).WithObjects(testLease(v1.PolicyCurrent, false)).Build()
	f.Fuzz(func(t *testing.T, body []byte) {
		rec := serve(t, fence, body)
		if rec.Code == 0 {
			t.Fatal("no status code")
		}
	})
}
