package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/internal/etcdstore"
	"github.com/fencer-io/fencer/internal/webhook"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
	"github.com/fencer-io/fencer/test/support/faultproxy"
	"github.com/fencer-io/fencer/test/support/framework"
)

// TestBlackholedLeaseWatch cuts the webhook's watch of Leases (its
// informer reaches the apiserver through a proxy that forwards nothing)
// while the Lease is handed over. The webhook's view of the Lease is then
// a stale prefix of its history: it still shows the old holder's token as
// the newest. The old holder's write must still be refused, from the live
// token in etcd, and the new holder's accepted. A Lease the view has never
// seen is read from the apiserver directly; when that read stalls too, the
// review ends in fencer's own refusal, ahead of the apiserver's timeout.
func TestBlackholedLeaseWatch(t *testing.T) {
	ns, holder, tok := setup(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)

	u, err := url.Parse(fx.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := faultproxy.Start(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	viaProxy := rest.CopyConfig(fx.Config)
	viaProxy.Host = "https://" + proxy.Addr()

	informers, err := cache.New(viaProxy, cache.Options{Scheme: fx.Env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	view, err := webhook.WatchLeases(ctx, informers)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = informers.Start(ctx) }()
	if !informers.WaitForCacheSync(ctx) {
		t.Fatal("the Lease informer never synced")
	}
	framework.Eventually(t, 30*time.Second, "the view shows the first grant", func() error {
		return viewShows(ctx, view, ns, "report", tok)
	})
	live := etcdstore.NewLiveReader(etcdstore.NewStore(fx.EtcdCli, etcdkeys.DefaultPrefix, nil, nil), nil)
	exempt := webhook.NewExempt(webhook.DefaultExemptUsers, nil)
	// The watch alone is cut: a Lease the view lacks is read directly.
	checker := &webhook.Checker{Leases: view, APIReader: fx.Client, Live: live, Exempt: exempt}
	// The apiserver is cut off entirely, watch and reads.
	apiReaderViaProxy, err := client.New(viaProxy, client.Options{Scheme: fx.Env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	// Warmed before the cut, as the manager's reader is: its REST mapping
	// of Leases is known, so what stalls is the read itself.
	if err := apiReaderViaProxy.Get(ctx, client.ObjectKey{Namespace: ns, Name: "report"}, &fencerv1.Lease{}); err != nil {
		t.Fatal(err)
	}
	cutOff := &webhook.Checker{Leases: view, APIReader: apiReaderViaProxy, Live: live, Exempt: exempt}

	if out := review(t, checker, ns, "report", tok, tok); !out.Allowed {
		t.Fatalf("the holder's write before the cut: %s", out.Result.Message)
	}

	proxy.Set(faultproxy.Blackhole)
	next, tok2 := failOver(t, ns, holder)
	if err := viewShows(ctx, view, ns, "report", tok); err != nil {
		t.Fatalf("the view saw the handover, so the watch was not cut: %v", err)
	}

	// The view cannot tell tok is stale; etcd's live token can.
	out := review(t, checker, ns, "report", tok, tok)
	want := fmt.Sprintf("stale token %d for lease %s/report: current token is %d (holder %s)", tok, ns, tok2, next)
	if out.Allowed || !strings.Contains(out.Result.Message, want) {
		t.Fatalf("the old holder's write under a stale view: allowed %v, %q; want refused with %q", out.Allowed, out.Result.Message, want)
	}
	if out := review(t, checker, ns, "report", tok2, tok); !out.Allowed {
		t.Fatalf("the new holder's write under a stale view: %s", out.Result.Message)
	}

	// A Lease created during the cut, which the view never saw.
	late := &fencerv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "late", Namespace: ns},
		Spec:       fencerv1.LeaseSpec{TTLSeconds: 2, HolderSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "w"}}},
	}
	if err := fx.Client.Create(ctx, late); err != nil {
		t.Fatal(err)
	}
	var lateTok int64
	framework.Eventually(t, 60*time.Second, "lease late held", func() error {
		if err := fx.Client.Get(ctx, client.ObjectKeyFromObject(late), late); err != nil {
			return err
		}
		if lateTok = late.Status.Token; lateTok == 0 {
			return fmt.Errorf("not held yet")
		}
		return nil
	})
	if out := review(t, checker, ns, "late", lateTok, 0); !out.Allowed {
		t.Fatalf("a write under a Lease the view never saw, read directly: %s", out.Result.Message)
	}
	out = review(t, cutOff, ns, "late", lateTok, 0)
	want = fmt.Sprintf("cannot read lease %s/late from the apiserver", ns)
	if out.Allowed || out.Result.Code != http.StatusServiceUnavailable || !strings.Contains(out.Result.Message, want) ||
		!strings.Contains(out.Result.Message, "no answer before the review's deadline") {
		t.Fatalf("a review whose Lease read stalls: allowed %v, code %d, %q; want a 503 naming the deadline and %q",
			out.Allowed, out.Result.Code, out.Result.Message, want)
	}

	proxy.Set(faultproxy.Pass)
	framework.Eventually(t, 90*time.Second, "the view catches up once the watch heals", func() error {
		return viewShows(ctx, view, ns, "report", tok2)
	})
}

// viewShows checks that the view's Lease ns/name records token tok.
func viewShows(ctx context.Context, view *webhook.LeaseView, ns, name string, tok int64) error {
	l, err := view.Lease(ctx, ns, name)
	if err != nil {
		return err
	}
	if l.Status.Token != tok {
		return fmt.Errorf("the view's Lease %s/%s records token %d, not %d", ns, name, l.Status.Token, tok)
	}
	return nil
}

// review sends the checker an UPDATE of the ConfigMap "out", fenced by
// lease, offering token offered over a record of token recorded (none if
// 0), as the apiserver sends it, with its 3 s timeout. It waits for the
// answer, failing the test only if none ever comes.
func review(t *testing.T, c *webhook.Checker, ns, lease string, offered, recorded int64) *admissionv1.AdmissionResponse {
	t.Helper()
	meta := func(ann map[string]string) []byte {
		b, err := json.Marshal(map[string]any{"metadata": map[string]any{
			"name": "out", "namespace": ns, "labels": map[string]string{fencerv1.LeaseLabel: lease}, "annotations": ann}})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	old := map[string]string{}
	if recorded > 0 {
		old[fencerv1.WrittenTokenAnnotation] = itoa(recorded)
	}
	body, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID: "u", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "ConfigMap"},
			Resource: metav1.GroupVersionResource{Version: "v1", Resource: "configmaps"}, Name: "out", Namespace: ns,
			Operation: admissionv1.Update, UserInfo: authenticationv1.UserInfo{Username: "system:serviceaccount:" + ns + ":default"},
			Object:    runtime.RawExtension{Raw: meta(map[string]string{fencerv1.TokenAnnotation: itoa(offered)})},
			OldObject: runtime.RawExtension{Raw: meta(old)},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest(http.MethodPost, webhook.RecordPath+"?timeout=3s", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	answered := make(chan []byte, 1)
	go func() {
		rec := httptest.NewRecorder()
		(&webhook.Review{Handler: admission.HandlerFunc(c.Record)}).ServeHTTP(rec, req)
		answered <- rec.Body.Bytes()
	}()
	var raw []byte
	select {
	case raw = <-answered:
	case <-time.After(time.Minute): // not a timing assertion: a stalled review never answers
		t.Fatalf("no answer to a review under lease %s/%s", ns, lease)
	}
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(raw, &out); err != nil || out.Response == nil || out.Response.Result == nil {
		t.Fatalf("no AdmissionReview back: %v %s", err, raw)
	}
	return out.Response
}
