package webhook

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

func TestRequestTimeout(t *testing.T) {
	for _, c := range []struct {
		query string
		want  time.Duration
		ok    bool
	}{
		{"timeout=5s", 5 * time.Second, true},
		{"timeout=4.998s", 4998 * time.Millisecond, true},
		{"a=b&timeout=1m0s&c=d", time.Minute, true},
		{"timeout=900%C2%B5s", 900 * time.Microsecond, true}, // µs, as the apiserver's client escapes it
		{"", 0, false},
		{"timeouts=5s", 0, false},
		{"timeout=", 0, false},
		{"timeout=abc", 0, false},
		{"timeout=-1s", 0, false},
		{"timeout=0s", 0, false},
	} {
		got, ok := requestTimeout(c.query)
		if got != c.want || ok != c.ok {
			t.Errorf("requestTimeout(%q) = %v, %v; want %v, %v", c.query, got, ok, c.want, c.ok)
		}
	}
}

// A review is judged under a deadline ahead of the apiserver's, so a read
// that stalls ends in fencer's refusal, not in the apiserver's timeout.
func TestReviewDeadlineComesBeforeTheAPIServers(t *testing.T) {
	for _, c := range []struct {
		query  string
		budget time.Duration // 0: no deadline
	}{
		{"?timeout=5s", 4 * time.Second},
		{"?timeout=30s", 29 * time.Second},
		{"?timeout=500ms", 400 * time.Millisecond},
		{"", 0},
		{"?timeout=never", 0},
	} {
		var deadline time.Time
		var hasDeadline bool
		h := &Review{Handler: admission.HandlerFunc(func(ctx context.Context, _ admission.Request) admission.Response {
			deadline, hasDeadline = ctx.Deadline()
			return admission.Allowed("")
		})}
		req := httptest.NewRequest(http.MethodPost, RecordPath+c.query, bytes.NewReader(reviewBody(t, admissionv1.AdmissionRequest{UID: "u", Operation: admissionv1.Update})))
		req.Header.Set("Content-Type", "application/json")
		before := time.Now()
		h.ServeHTTP(httptest.NewRecorder(), req)
		after := time.Now()
		switch {
		case c.budget == 0 && hasDeadline:
			t.Errorf("%q: deadline %v, want none", c.query, deadline)
		case c.budget > 0 && (!hasDeadline || deadline.Before(before.Add(c.budget)) || deadline.After(after.Add(c.budget))):
			t.Errorf("%q: deadline %v (set: %v), want %v after the request arrived", c.query, deadline.Sub(before), hasDeadline, c.budget)
		}
	}
}

// A handler stuck on a read is cut at the review's deadline, and its
// refusal reaches the apiserver before the apiserver's own timeout.
func TestStalledReviewIsAnsweredBeforeTheTimeout(t *testing.T) {
	h := &Review{Handler: admission.HandlerFunc(func(ctx context.Context, _ admission.Request) admission.Response {
		<-ctx.Done() // a read through a blackholed link
		return admission.Errored(http.StatusServiceUnavailable, ctx.Err())
	})}
	req := httptest.NewRequest(http.MethodPost, RecordPath+"?timeout=300ms", bytes.NewReader(reviewBody(t, admissionv1.AdmissionRequest{UID: "u-2", Operation: admissionv1.Update})))
	req.Header.Set("Content-Type", "application/json")
	answered := make(chan *httptest.ResponseRecorder, 1)
	go func() {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		answered <- rec
	}()
	select {
	case rec := <-answered:
		if !bytes.Contains(rec.Body.Bytes(), []byte(`"allowed":false`)) || !bytes.Contains(rec.Body.Bytes(), []byte("deadline exceeded")) {
			t.Fatalf("answer %s, want a refusal naming the deadline", rec.Body.String())
		}
	case <-time.After(time.Minute): // not a timing assertion: without the deadline it never answers
		t.Fatal("a review whose read stalls was never answered")
	}
}
