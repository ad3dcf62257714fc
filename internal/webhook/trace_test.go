package webhook

import (
	"context"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	authnv1 "k8s.io/api/authentication/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// TestRefusalsAreTraced: a refused write carries audit annotations naming
// the decision and the tokens, and puts a Warning Event naming the
// requester and its pod on the Lease, at most one per Lease per interval.
func TestRefusalsAreTraced(t *testing.T) {
	f := newChecker(t, fakeLive{live: held(42, 50)})
	rec := events.NewFakeRecorder(10)
	now := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	f.Refusals = &Refusals{Recorder: rec, Leases: f.Leases, now: func() time.Time { return now }}
	stale := func() admission.Request {
		r := request(admissionv1.Update, obj("report", "41"), stored("report", "", "40"))
		r.UserInfo = authnv1.UserInfo{Username: "system:serviceaccount:default:worker", Groups: []string{"system:serviceaccounts"},
			Extra: map[string]authnv1.ExtraValue{podNameKey: {"worker-7"}}}
		return r
	}
	resp := f.Record(context.Background(), stale())
	if resp.Allowed {
		t.Fatal("a stale token was allowed")
	}
	want := map[string]string{"decision": "refused", "reason": "BelowLiveToken", "lease": "default/report", "offered-token": "41", "current-token": "42"}
	for k, v := range want {
		if resp.AuditAnnotations[k] != v {
			t.Errorf("audit annotation %s = %q, want %q (all: %v)", k, resp.AuditAnnotations[k], v, resp.AuditAnnotations)
		}
	}
	select {
	case e := <-rec.Events:
		for _, s := range []string{"Warning", ReasonWriteRefused, "system:serviceaccount:default:worker", "pod worker-7", "BelowLiveToken", `offered token "41"`, "current token 42"} {
			if !strings.Contains(e, s) {
				t.Errorf("Event %q does not say %q", e, s)
			}
		}
	default:
		t.Fatal("no Event on the Lease")
	}
	// A retry loop within the interval: no second Event.
	f.Record(context.Background(), stale())
	select {
	case e := <-rec.Events:
		t.Fatalf("a second Event within %s: %q", RefusalEventInterval, e)
	default:
	}
	now = now.Add(RefusalEventInterval)
	f.Record(context.Background(), stale())
	if len(rec.Events) != 1 {
		t.Fatalf("no Event after the interval passed")
	}
	// A refused dry run (kubectl fencer check) is logged and annotated, but
	// attempted nothing: no Event.
	now = now.Add(RefusalEventInterval)
	dry := stale()
	yes := true
	dry.DryRun = &yes
	if resp := f.Record(context.Background(), dry); resp.Allowed || resp.AuditAnnotations["reason"] != "BelowLiveToken" {
		t.Fatalf("a stale dry run: allowed %v, audit %v", resp.Allowed, resp.AuditAnnotations)
	}
	if len(rec.Events) != 1 {
		t.Fatalf("a dry run put an Event on the Lease")
	}
	// Allowed writes carry no refusal annotations.
	ok := f.Record(context.Background(), request(admissionv1.Update, obj("report", "42"), stored("report", "", "40")))
	if !ok.Allowed || ok.AuditAnnotations["decision"] != "" {
		t.Fatalf("the live token: allowed %v, audit %v", ok.Allowed, ok.AuditAnnotations)
	}
}
