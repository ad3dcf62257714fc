package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
	kjson "sigs.k8s.io/json"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/internal/metrics"
)

// apiserverCodecs decode an AdmissionReview as Kubernetes' own code does:
// apimachinery's JSON serializer, with the admission types registered.
var apiserverCodecs = func() serializer.CodecFactory {
	s := runtime.NewScheme()
	utilruntime.Must(admissionv1.AddToScheme(s))
	return serializer.NewCodecFactory(s)
}()

// readFields is every field of a request that fencer reads, as the
// admission.Request its handlers get.
func readFields(r *admissionv1.AdmissionRequest) admissionv1.AdmissionRequest {
	return admissionv1.AdmissionRequest{
		UID: r.UID, Kind: r.Kind, Resource: r.Resource, SubResource: r.SubResource,
		Name: r.Name, Namespace: r.Namespace, Operation: r.Operation, UserInfo: r.UserInfo,
		Object: r.Object, OldObject: r.OldObject, DryRun: r.DryRun,
	}
}

// agreeOnReview fails when the lean decoder reads a review differently
// from the apiserver's decoder. Where the apiserver's decoder cannot read
// body, the apiserver never sends it, so only a panic would be a failure.
func agreeOnReview(t *testing.T, body []byte) {
	t.Helper()
	lean, leanErr := decodeReview(body)
	ref := &admissionv1.AdmissionReview{}
	_, gvk, refErr := apiserverCodecs.UniversalDeserializer().Decode(body, nil, ref)
	if refErr != nil {
		return
	}
	if leanErr != nil {
		// The lean decoder refuses only what fencer's configurations
		// never ask for: a review without a request, or one that names
		// (keys matched case-sensitively) another version or kind.
		var named struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		_ = kjson.UnmarshalCaseSensitivePreserveInts(body, &named)
		other := (named.APIVersion != "" && named.APIVersion != "admission.k8s.io/v1") || (named.Kind != "" && named.Kind != "AdmissionReview")
		if ref.Request == nil || other {
			return
		}
		t.Fatalf("the apiserver's decoder reads %q (%v), the lean one refuses it: %v", body, gvk, leanErr)
	}
	leanReq := lean.request(body)
	got, want := readFields(&leanReq.AdmissionRequest), readFields(ref.Request)
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%q:\nlean reads      %+v\napiserver reads %+v", body, got, want)
	}
}

func reviewBody(t testing.TB, r admissionv1.AdmissionRequest) []byte {
	body, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"}, Request: &r})
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// The reviews the apiserver sends, and bodies crafted where a decoder
// could slip: keys in another case, duplicates, nulls, large numbers.
func TestReviewDecodeAgreesWithTheAPIServer(t *testing.T) {
	dry := true
	full := admissionv1.AdmissionRequest{
		UID: "7c1b", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "ConfigMap"},
		Resource: metav1.GroupVersionResource{Version: "v1", Resource: "configmaps"}, SubResource: "status",
		Name: "report", Namespace: "t1", Operation: admissionv1.Update, DryRun: &dry,
		UserInfo: authenticationv1.UserInfo{Username: "system:serviceaccount:t1:w", UID: "u", Groups: []string{"a", "b"},
			Extra: map[string]authenticationv1.ExtraValue{podNameKey: {"w-0"}}},
		Object:    runtime.RawExtension{Raw: []byte(`{"metadata":{"labels":{"fencer.io/lease":"report"}}}`)},
		OldObject: runtime.RawExtension{Raw: []byte(`{"metadata":{"name":"report","n":123456789012345678901234567890}}`)},
	}
	for _, body := range [][]byte{
		reviewBody(t, full),
		reviewBody(t, admissionv1.AdmissionRequest{UID: "1", Operation: admissionv1.Delete}),
		[]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"1","operation":"CREATE","Operation":"DELETE","object":{"a":1}}}`),
		[]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"1","object":null,"oldObject":{"x":[1,2]}}}`),
		[]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"1","name":"a"},"request":{"uid":"2"}}`),
		[]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","Request":{"uid":"1"},"request":{"uid":"2","userInfo":{"extra":{"k":null}}}}`),
		// A name twice in one object, and strings that are not UTF-8:
		// the apiserver passes a ControllerRevision's data on as its
		// client sent it, so both reach the webhook.
		[]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"1","name":"a","name":"b","object":{"data":{"a":1,"a":2}}}}`),
		[]byte("{\"apiVersion\":\"admission.k8s.io/v1\",\"kind\":\"AdmissionReview\",\"request\":{\"uid\":\"1\",\"name\":\"\xff\\ud800\",\"object\":{\"data\":\"\xfe\"}}}"),
		[]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"1","object":{"a":1},"object":null,"oldObject":null}}`),
	} {
		agreeOnReview(t, body)
	}
}

// The apiserver passes a ControllerRevision's data on as its client sent
// it, names repeated and bytes that are not UTF-8 included: a review of one
// is read, and its labels with it, so a fenced one is judged like any other
// object and its lifecycle writes stay exempt.
func TestReviewOfVerbatimEmbeddedJSONIsRead(t *testing.T) {
	sent := []byte("{\"apiVersion\":\"apps/v1\",\"kind\":\"ControllerRevision\",\"metadata\":{\"name\":\"r\",\"labels\":{\"fencer.io/lease\":\"report\"}},\"revision\":1,\"data\":{\"a\":1,\"a\":\"\xff\\ud800\"}}")
	cr := &appsv1.ControllerRevision{}
	if err := json.Unmarshal(sent, cr); err != nil {
		t.Fatal(err)
	}
	// Encoded as the apiserver encodes it: the data's bytes as they came.
	obj, err := json.Marshal(cr)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(obj, []byte("\"a\":1,\"a\":\"\xff")) {
		t.Fatalf("the encoded object no longer carries the data verbatim: %s", obj)
	}
	body := reviewBody(t, admissionv1.AdmissionRequest{UID: "1", Operation: admissionv1.Update, Name: "r",
		Object: runtime.RawExtension{Raw: obj}, OldObject: runtime.RawExtension{Raw: obj}})
	agreeOnReview(t, body)
	in, err := decodeReview(body)
	if err != nil {
		t.Fatalf("the review of a ControllerRevision is refused: %v", err)
	}
	req := in.request(body)
	m, err := decodeMeta(req.Object.Raw)
	if err != nil {
		t.Fatalf("its object cannot be read: %v", err)
	}
	if got := labelOf(m); got != "report" {
		t.Fatalf("lease label %q, want report", got)
	}
}

// FuzzReviewDecode: the lean decoder reads every field fencer uses as the
// apiserver's decoder reads it, from any bytes that decoder accepts.
func FuzzReviewDecode(f *testing.F) {
	f.Add(reviewBody(f, admissionv1.AdmissionRequest{UID: "1", Operation: admissionv1.Update, Name: "a",
		Object: runtime.RawExtension{Raw: []byte(`{"metadata":{}}`)}, OldObject: runtime.RawExtension{Raw: []byte(`{}`)}}))
	f.Add([]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"1","Operation":"DELETE","object":null}}`))
	f.Add([]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"dryRun":null,"userInfo":{"groups":null,"extra":{}}}}`))
	f.Fuzz(agreeOnReview)
}

// A review the webhook cannot take is answered, in an AdmissionReview that
// says why, never with a crash or a silent success.
func TestReviewRefusesWhatIsNotAV1AdmissionReview(t *testing.T) {
	h := &Review{Handler: admission.HandlerFunc(func(_ context.Context, _ admission.Request) admission.Response {
		return admission.Allowed("")
	})}
	for _, tc := range []struct {
		name, contentType, body string
		code                    int32
		msg                     string
	}{
		{"no body", "application/json", "", 400, "body is empty"},
		{"yaml", "application/yaml", `{}`, 400, `content type "application/yaml"`},
		{"not JSON", "application/json", `{`, 400, "cannot decode the AdmissionReview"},
		{"v1beta1", "application/json", `{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{"uid":"1"}}`, 400, "admissionReviewVersions: [v1]"},
		{"another kind", "application/json", `{"apiVersion":"admission.k8s.io/v1","kind":"Pod","request":{"uid":"1"}}`, 400, `kind "Pod"`},
		{"no request", "application/json", `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`, 400, "has no request"},
		{"too large", "application/json", `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"name":"` + strings.Repeat("x", MaxReviewBytes) + `"}}`, 413, "over 7340032 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var body io.Reader = http.NoBody
			if tc.body != "" {
				body = strings.NewReader(tc.body)
			}
			out := postReview(t, h, tc.contentType, body)
			if out.Response.Allowed || out.Response.Result.Code != tc.code || !strings.Contains(out.Response.Result.Message, tc.msg) {
				t.Fatalf("response %+v, want code %d and %q", out.Response, tc.code, tc.msg)
			}
		})
	}
}

// A handler that panics refuses the write (the webhooks fail closed), the
// response still names the request, and the refusal is counted.
func TestReviewRefusesWhenTheHandlerPanics(t *testing.T) {
	h := &Review{Handler: admission.HandlerFunc(func(_ context.Context, _ admission.Request) admission.Response {
		panic("boom")
	})}
	panics := metrics.AdmissionDecisions.WithLabelValues("UPDATE", "refused", string(ReasonHandlerPanicked))
	before := testutil.ToFloat64(panics)
	out := postReview(t, h, "application/json", bytes.NewReader(reviewBody(t, admissionv1.AdmissionRequest{UID: "u-1", Operation: admissionv1.Update})))
	if out.Response.Allowed || out.Response.UID != "u-1" || out.Response.Result.Code != 500 || !strings.Contains(out.Response.Result.Message, "boom") {
		t.Fatalf("response %+v", out.Response)
	}
	if got := testutil.ToFloat64(panics) - before; got != 1 {
		t.Fatalf("fencer_admission_decisions_total{reason=HandlerPanicked} rose by %v, want 1", got)
	}
}

// postReview posts body to h and decodes the AdmissionReview it answers,
// which must carry a response with a status.
func postReview(t *testing.T, h http.Handler, contentType string, body io.Reader) admissionv1.AdmissionReview {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, RecordPath, body)
	req.Header.Set("Content-Type", contentType)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil || out.Response == nil || out.Response.Result == nil {
		t.Fatalf("no AdmissionReview back: %v %s", err, rec.Body.String())
	}
	return out
}

// sameAsEncodingJSON fails when appendReview writes other bytes than
// encoding/json writes for resp.
func sameAsEncodingJSON(t *testing.T, resp admission.Response) {
	t.Helper()
	if err := complete(&resp, resp.UID); err != nil {
		t.Fatal(err)
	}
	ops, err := json.Marshal(resp.Patches)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Patches) > 0 && !bytes.Equal(resp.Patch, ops) {
		t.Fatalf("patch:\nlean          %s\nencoding/json %s", resp.Patch, ops)
	}
	want, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"}, Response: &resp.AdmissionResponse})
	if err != nil {
		t.Fatal(err)
	}
	if got := appendReview(nil, &resp.AdmissionResponse); !bytes.Equal(got, want) {
		t.Fatalf("\nlean          %s\nencoding/json %s", got, want)
	}
}

func TestAppendReviewIsEncodingJSON(t *testing.T) {
	refused := denied(&Denial{Code: 409, Reason: Reason(fencerv1.DenialBelowLive), Lease: "t1/report", Offered: "41", Current: 42, Holder: "w-1",
		Message: `fencer: token 41 <is> "stale" & so\ on` + "\t\n\x01\u2028\u2029\xff é"})
	refused.AuditAnnotations = map[string]string{"reason": "Stale", "lease": "t1/report", "decision": "refused"}
	refused.Warnings = []string{"a", "<b>"}
	refused.UID = "u-2"
	for _, resp := range []admission.Response{
		admission.Allowed(""),
		admission.Allowed("not fenced"),
		admission.Patched("", jsonpatch.JsonPatchOperation{Operation: "remove", Path: "/metadata/annotations/fencer.io~1token"},
			jsonpatch.JsonPatchOperation{Operation: "add", Path: "/metadata/annotations/fencer.io~1written-token", Value: "42"}),
		admission.Patched("", jsonpatch.JsonPatchOperation{Operation: "add", Path: "/metadata/annotations", Value: map[string]string{"b": "1", "a": "<2>"}},
			jsonpatch.JsonPatchOperation{Operation: "add", Path: "/x"}, jsonpatch.JsonPatchOperation{Operation: "test", Path: "/y", Value: []int{1}}),
		refused,
		admission.Errored(500, errors.New("boom")),
		{AdmissionResponse: admissionv1.AdmissionResponse{Result: &metav1.Status{Details: &metav1.StatusDetails{Name: "x"}}}}, // encoding/json's fallback
	} {
		sameAsEncodingJSON(t, resp)
	}
}

// FuzzAppendReview: for any strings a response can carry, the lean
// encoder writes what encoding/json writes.
func FuzzAppendReview(f *testing.F) {
	f.Add("u", "fencer: token 41 <is> \"stale\"", "Stale", "fencer.io~1token", "42", "k", "v", false)
	f.Add("", "\xff\u2028\x00", "", "", "", "", "", true)
	f.Fuzz(func(t *testing.T, uid, msg, cause, path, value, key, annotation string, allowed bool) {
		resp := admission.Response{AdmissionResponse: admissionv1.AdmissionResponse{UID: types.UID(uid), Allowed: allowed,
			Result:           &metav1.Status{Message: msg, Code: 409, Details: &metav1.StatusDetails{Causes: []metav1.StatusCause{{Type: metav1.CauseType(cause), Message: value}}}},
			AuditAnnotations: map[string]string{key: annotation}, Warnings: []string{msg}}}
		resp.Patches = []jsonpatch.JsonPatchOperation{{Operation: "add", Path: path, Value: value}, {Operation: cause, Path: path}}
		sameAsEncodingJSON(t, resp)
	})
}
