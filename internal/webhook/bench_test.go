package webhook

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
)

// BenchmarkServeHTTP: one AdmissionReview through the webhook's HTTP handler
// (decode, Lease from a cache, decision, encode), with the etcd lookup
// replaced by a constant: the webhook's own cost, not etcd's. "accepted" is
// the holder's write (the hot path, patched with its record); "refused" a
// stale pod's, refused from the Lease's status without an etcd read.
func BenchmarkServeHTTP(b *testing.B) {
	for _, bc := range []struct {
		name     string
		obj, old []byte
		allowed  bool
	}{
		// Tokens of an etcd in use: Go boxes an int64 above 255 into an
		// interface with an allocation, and 41 would hide it.
		{"accepted", obj("report", "7000042"), stored("report", "", "7000041"), true},
		{"refused", obj("report", "7000041"), stored("report", "", "7000042"), false},
	} {
		b.Run(bc.name, func(b *testing.B) {
			f := newChecker(b, fakeLive{live: held(7000042, 7000050)})
			// The Lease as the manager reads it: from its informer, shared.
			view, inf := fakeLeaseInformer(b)
			inf.Add(testLease(fencerv1.PolicyCurrent, false))
			f.Leases = view
			h := &Review{Handler: admission.HandlerFunc(f.Record)}
			review := admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"}}
			r := request(admissionv1.Update, bc.obj, bc.old)
			review.Request = &r.AdmissionRequest
			body, err := json.Marshal(review)
			if err != nil {
				b.Fatal(err)
			}
			if out := reviewOnce(b, h, body); out.Response.Allowed != bc.allowed {
				b.Fatalf("allowed %v, want %v: %+v", out.Response.Allowed, bc.allowed, out.Response.Result)
			}
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				// One request and one writer per goroutine, reused: what
				// is measured is the handler, not the test's HTTP plumbing.
				rd := bytes.NewReader(body)
				// The path as the apiserver sends it, with its timeout.
				req, _ := http.NewRequest(http.MethodPost, RecordPath+"?timeout=5s", io.NopCloser(rd))
				req.Header.Set("Content-Type", "application/json")
				w := &discardWriter{header: http.Header{}}
				for pb.Next() {
					rd.Reset(body)
					h.ServeHTTP(w, req)
				}
			})
		})
	}
}

// reviewOnce serves body once and decodes the answer.
func reviewOnce(b *testing.B, h http.Handler, body []byte) admissionv1.AdmissionReview {
	req, _ := http.NewRequest(http.MethodPost, RecordPath, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	w := &discardWriter{header: http.Header{}}
	h.ServeHTTP(w, req)
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(w.last, &out); err != nil || out.Response == nil {
		b.Fatalf("no AdmissionReview back: %v %s", err, w.last)
	}
	return out
}

// discardWriter is an http.ResponseWriter that keeps only the last body.
type discardWriter struct {
	header http.Header
	last   []byte
}

func (w *discardWriter) Header() http.Header { return w.header }
func (w *discardWriter) WriteHeader(int)     {}
func (w *discardWriter) Write(p []byte) (int, error) {
	w.last = append(w.last[:0], p...)
	return len(p), nil
}
