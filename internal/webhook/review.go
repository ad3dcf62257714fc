package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	jsonv1 "github.com/go-json-experiment/json/v1"
	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/fencer-io/fencer/internal/metrics"
)

// MaxReviewBytes bounds an AdmissionReview's body: two objects of at most
// 3 MiB each (twice etcd's default request limit, as JSON) and the rest.
// It is the bound controller-runtime's own webhook applies.
const MaxReviewBytes = 7 << 20

// Review serves one admission webhook over HTTP. It does what
// controller-runtime's admission.Webhook does, leaner, because every fenced
// write in the cluster passes through it:
//   - the body is read into a pooled buffer;
//   - the AdmissionReview is decoded, case-sensitively as the apiserver
//     decodes it, into only the fields a decision reads, by the JSON v2
//     decoder with encoding/json's semantics (asTheAPIServerReads), whose
//     scanner is faster than encoding/json's, and the objects are not
//     copied out of the body;
//   - the response is encoded without reflection (appendReview).
//
// FuzzReviewDecode holds that it reads what the apiserver's own decoder
// reads.
type Review struct {
	Handler admission.Handler
}

// reviewIn is the part of an AdmissionReview that fencer reads.
type reviewIn struct {
	APIVersion string     `json:"apiVersion"`
	Kind       string     `json:"kind"`
	Request    *requestIn `json:"request"`
}

// requestIn is the part of an AdmissionRequest that fencer reads.
type requestIn struct {
	UID         types.UID                   `json:"uid"`
	Kind        metav1.GroupVersionKind     `json:"kind"`
	Resource    metav1.GroupVersionResource `json:"resource"`
	SubResource string                      `json:"subResource"`
	Name        string                      `json:"name"`
	Namespace   string                      `json:"namespace"`
	Operation   admissionv1.Operation       `json:"operation"`
	UserInfo    authenticationv1.UserInfo   `json:"userInfo"`
	Object      span                        `json:"object"`
	OldObject   span                        `json:"oldObject"`
	DryRun      *bool                       `json:"dryRun"`
}

// span is where a JSON value sits in the body it was decoded from, so that
// an object is sliced from the body, not copied out of it: the body
// outlives the review's handling (ServeHTTP returns its buffer to the pool
// only after the response is written). A JSON null is no object, as
// runtime.RawExtension reads it.
type span struct{ start, end int64 }

func (s *span) UnmarshalJSONFrom(dec *jsontext.Decoder) error {
	v, err := dec.ReadValue()
	if err != nil {
		return err
	}
	if v.Kind() == 'n' {
		return nil // as RawExtension reads a null: no change
	}
	// The decoder stands just past the value it returned, as written in
	// the body (ReadValue returns the raw bytes).
	end := dec.InputOffset()
	*s = span{end - int64(len(v)), end}
	return nil
}

// of is the value s spans in body, or nil for none.
func (s span) of(body []byte) []byte {
	if s.end == 0 {
		return nil
	}
	return body[s.start:s.end:s.end]
}

// bodies recycles the buffers reviews are read into. Buffers that grew
// past pooledBufferBytes (a review of large objects) are dropped, so one
// large review does not pin its memory; answers does the same.
var bodies = sync.Pool{New: func() any { return new(bytes.Buffer) }}

const pooledBufferBytes = 256 << 10

func (v *Review) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	buf := bodies.Get().(*bytes.Buffer)
	buf.Reset()
	defer func() {
		if buf.Cap() <= pooledBufferBytes {
			bodies.Put(buf)
		}
	}()
	req, code, err := readReview(r, buf)
	if err != nil {
		ctrl.LoggerFrom(r.Context()).Error(err, "refused an admission request that is not an AdmissionReview", "path", r.URL.Path)
		writeReview(w, errored(code, err, ""))
		return
	}
	ctx, cancel := answerDeadline(r)
	defer cancel()
	writeReview(w, v.handle(ctx, req))
}

// readReview reads an AdmissionReview from r's body into buf. code is the
// HTTP status of the error, if any.
func readReview(r *http.Request, buf *bytes.Buffer) (req admission.Request, code int32, err error) {
	if r.Body == nil || r.Body == http.NoBody {
		return req, http.StatusBadRequest, fmt.Errorf("the request body is empty: send an AdmissionReview")
	}
	defer r.Body.Close()
	if ct := r.Header.Get("Content-Type"); ct != "application/json" {
		return req, http.StatusBadRequest, fmt.Errorf("content type %q: an AdmissionReview is sent as application/json", ct)
	}
	if _, err := buf.ReadFrom(io.LimitReader(r.Body, MaxReviewBytes+1)); err != nil {
		return req, http.StatusBadRequest, fmt.Errorf("reading the request body: %w", err)
	}
	if buf.Len() > MaxReviewBytes {
		return req, http.StatusRequestEntityTooLarge, fmt.Errorf("the AdmissionReview is over %d bytes", MaxReviewBytes)
	}
	in, err := decodeReview(buf.Bytes())
	if err != nil {
		return req, http.StatusBadRequest, err
	}
	return in.request(buf.Bytes()), 0, nil
}

// decodeReview decodes body as the apiserver's decoder does: keys match
// case-sensitively, unknown fields are ignored, and a missing apiVersion or
// kind reads as the AdmissionReview's. fencer's webhook configurations ask
// for admission.k8s.io/v1 only, so a review that names another version or
// kind is refused, not guessed at.
func decodeReview(body []byte) (*reviewIn, error) {
	in := &reviewIn{}
	if err := jsonv2.Unmarshal(body, in, asTheAPIServerReads); err != nil {
		return nil, fmt.Errorf("cannot decode the AdmissionReview: %w", err)
	}
	if !slices.Contains([]string{"", reviewAPIVersion}, in.APIVersion) || !slices.Contains([]string{"", "AdmissionReview"}, in.Kind) {
		return nil, fmt.Errorf("got apiVersion %q kind %q: fencer answers %s AdmissionReviews only (admissionReviewVersions: [v1] in the webhook configuration)",
			in.APIVersion, in.Kind, reviewAPIVersion)
	}
	if in.Request == nil {
		return nil, fmt.Errorf("the AdmissionReview has no request")
	}
	return in, nil
}

var reviewAPIVersion = admissionv1.SchemeGroupVersion.String()

// asTheAPIServerReads are the JSON v2 options that read JSON as the
// apiserver's decoder (sigs.k8s.io/json) does: encoding/json's semantics,
// with names matched case-sensitively. They read, not refuse, a name
// repeated in one object and a string that is not UTF-8 (mended to
// U+FFFD): the apiserver passes some embedded JSON on as its client sent
// it (a ControllerRevision's data), and a review that carries it must be
// judged like any other.
var asTheAPIServerReads = jsonv2.JoinOptions(jsonv1.DefaultOptionsV1(), jsonv2.MatchCaseInsensitiveNames(false))

// request is in, decoded from body, as the admission.Request the handlers
// take.
func (in *reviewIn) request(body []byte) admission.Request {
	r := in.Request
	return admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID: r.UID, Kind: r.Kind, Resource: r.Resource, SubResource: r.SubResource,
		Name: r.Name, Namespace: r.Namespace, Operation: r.Operation, UserInfo: r.UserInfo,
		Object: runtime.RawExtension{Raw: r.Object.of(body)}, OldObject: runtime.RawExtension{Raw: r.OldObject.of(body)}, DryRun: r.DryRun,
	}}
}

// handle runs the handler, completes its response as the apiserver expects
// it (the request's UID, a status code, the patch encoded), and turns a
// panic into a refusal: the webhooks fail closed.
func (v *Review) handle(ctx context.Context, req admission.Request) (resp admission.Response) {
	defer func() {
		if p := recover(); p != nil {
			ctrl.LoggerFrom(ctx).Error(fmt.Errorf("%v", p), "the admission handler panicked; the write is refused", "uid", req.UID)
			metrics.AdmissionDecisions.WithLabelValues(string(req.Operation), "refused", string(ReasonHandlerPanicked)).Inc()
			resp = errored(http.StatusInternalServerError, fmt.Errorf("fencer: internal error (%v); the write is refused, retry", p), req.UID)
		}
	}()
	resp = v.Handler.Handle(ctx, req)
	if err := complete(&resp, req.UID); err != nil {
		return errored(http.StatusInternalServerError, err, req.UID)
	}
	return resp
}

// complete is admission.Response.Complete, with the patch encoded by
// appendPatch.
func complete(resp *admission.Response, uid types.UID) error {
	resp.UID = uid
	if resp.Result == nil {
		resp.Result = &metav1.Status{}
	}
	if resp.Result.Code == 0 {
		resp.Result.Code = http.StatusOK
	}
	if len(resp.Patches) == 0 {
		return nil
	}
	// Room for the usual patch (the offer removed, the record set), so
	// that appending does not grow it.
	patch, err := appendPatch(make([]byte, 0, 256), resp.Patches)
	if err != nil {
		return err
	}
	resp.Patch = patch
	pt := admissionv1.PatchTypeJSONPatch
	resp.PatchType = &pt
	return nil
}

func errored(code int32, err error, uid types.UID) admission.Response {
	resp := admission.Errored(code, err)
	resp.UID = uid
	return resp
}

// answers recycles the buffers responses are encoded into, as bodies does
// for requests: a Write never keeps the bytes it is given.
var answers = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

// jsonContentType is the Content-Type of every answer, set without the
// allocation of Header.Set; no one appends to it in place.
var jsonContentType = []string{"application/json"}

// writeReview writes resp in an admission.k8s.io/v1 AdmissionReview.
func writeReview(w http.ResponseWriter, resp admission.Response) {
	buf := answers.Get().(*[]byte)
	out := appendReview((*buf)[:0], &resp.AdmissionResponse)
	w.Header()["Content-Type"] = jsonContentType
	// A failed write means the connection is gone: the apiserver times
	// out and applies the webhook's failurePolicy (Fail).
	_, _ = w.Write(out)
	if cap(out) <= pooledBufferBytes {
		*buf = out
		answers.Put(buf)
	}
}

// reviewJSON is the AdmissionReview written when appendReview cannot
// write a response itself.
func reviewJSON(resp *admissionv1.AdmissionResponse) []byte {
	out, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: reviewAPIVersion, Kind: "AdmissionReview"},
		Response: resp,
	})
	if err != nil { // every field of an AdmissionResponse encodes
		panic(err)
	}
	return out
}
