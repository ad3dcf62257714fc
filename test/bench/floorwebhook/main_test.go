package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
)

// The floor's hand-written response is an AdmissionReview the apiserver
// reads as fencer's: the review's UID, allowed, and the patch that moves
// the offer into the record.
func TestTheFloorAnswersAsFencerDoes(t *testing.T) {
	for _, c := range []struct {
		name, annotations string
		patch             bool
		wantOps           []map[string]string
	}{
		{"an offer", `{"bench.fencer.io/token":"42","other":"x"}`, true, []map[string]string{
			{"op": "remove", "path": "/metadata/annotations/bench.fencer.io~1token"},
			{"op": "add", "path": "/metadata/annotations/bench.fencer.io~1written-token", "value": "42"}}},
		{"an offer already recorded", `{"bench.fencer.io/token":"42","bench.fencer.io/written-token":"42"}`, true, []map[string]string{
			{"op": "remove", "path": "/metadata/annotations/bench.fencer.io~1token"}}},
		{"no offer", `{"other":"x"}`, true, nil},
		{"allow only", `{"bench.fencer.io/token":"42"}`, false, nil},
		{"an odd value", `{"bench.fencer.io/token":"\"\u0000\\"}`, true, []map[string]string{
			{"op": "remove", "path": "/metadata/annotations/bench.fencer.io~1token"},
			{"op": "add", "path": "/metadata/annotations/bench.fencer.io~1written-token", "value": "\"\x00\\"}}},
	} {
		body := `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u-1","kind":{"group":"","version":"v1","kind":"ConfigMap"},` +
			`"operation":"UPDATE","object":{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c","annotations":` + c.annotations + `},"data":{"k":"v"}}}}`
		rec := httptest.NewRecorder()
		serve(rec, httptest.NewRequest(http.MethodPost, "/", strings.NewReader(body)), c.patch)
		var got admissionv1.AdmissionReview
		if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
			t.Fatalf("%s: %v in %s", c.name, err, rec.Body)
		}
		if got.Kind != "AdmissionReview" || got.APIVersion != "admission.k8s.io/v1" || got.Response == nil || got.Response.UID != "u-1" || !got.Response.Allowed {
			t.Fatalf("%s: %s", c.name, rec.Body)
		}
		var ops []map[string]string
		if got.Response.Patch != nil {
			if got.Response.PatchType == nil || *got.Response.PatchType != admissionv1.PatchTypeJSONPatch {
				t.Fatalf("%s: a patch of type %v", c.name, got.Response.PatchType)
			}
			if err := json.Unmarshal(got.Response.Patch, &ops); err != nil {
				t.Fatalf("%s: patch %q: %v", c.name, got.Response.Patch, err)
			}
		}
		if !reflect.DeepEqual(ops, c.wantOps) {
			t.Errorf("%s: patch %v, want %v", c.name, ops, c.wantOps)
		}
	}
	rec := httptest.NewRecorder()
	serve(rec, httptest.NewRequest(http.MethodPost, "/", strings.NewReader(`{"kind":"AdmissionReview"}`)), true)
	if rec.Code != http.StatusBadRequest {
		t.Fatalf("a review without a request: %d %s", rec.Code, rec.Body)
	}
}
