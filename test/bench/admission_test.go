package bench

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/internal/webhook"
	"github.com/fencer-io/fencer/pkg/fence"
	"github.com/fencer-io/fencer/test/support/devcluster"
	"github.com/fencer-io/fencer/test/support/testenv"
)

// heldLease creates a Lease held by a fresh Ready pod and returns its
// namespace and token.
func heldLease(t *testing.T, name string) (string, int64) {
	t.Helper()
	ctx := context.Background()
	ns := fx.Namespace(t)
	fx.ReadyPod(t, ns, name+"-0", name, "")
	l := &fencerv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: fencerv1.LeaseSpec{TTLSeconds: 30, HolderSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": name}}}}
	if err := fx.Client.Create(ctx, l); err != nil {
		t.Fatal(err)
	}
	var token int64
	waitAll(t, 60*time.Second, func() (int, error) {
		if err := fx.Client.Get(ctx, client.ObjectKeyFromObject(l), l); err != nil {
			return 0, err
		}
		token = l.Status.Token
		if token == 0 {
			return 0, nil
		}
		return 1, nil
	}, 1)
	return ns, token
}

// review is the AdmissionReview the apiserver sends to the mutating
// webhook for a holder's merge patch of a fenced ConfigMap: the stored
// object carries the record of the last accepted write
// (fencer.io/written-token), and the new one also the token this write
// sends (fencer.io/token).
func review(t *testing.T, ns, lease string, token int64) []byte {
	t.Helper()
	tok := strconv.FormatInt(token, 10)
	cm := func(v string, annotations map[string]string) runtime.RawExtension {
		raw, err := json.Marshal(&corev1.ConfigMap{
			TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
			ObjectMeta: metav1.ObjectMeta{Name: "out", Namespace: ns, Labels: map[string]string{fencerv1.LeaseLabel: lease},
				Annotations: annotations},
			Data: map[string]string{"v": v},
		})
		if err != nil {
			t.Fatal(err)
		}
		return runtime.RawExtension{Raw: raw}
	}
	newObj := cm("new", map[string]string{fencerv1.WrittenTokenAnnotation: tok, fencerv1.TokenAnnotation: tok})
	oldObj := cm("old", map[string]string{fencerv1.WrittenTokenAnnotation: tok})
	r := admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID: types.UID("bench"), Kind: metav1.GroupVersionKind{Version: "v1", Kind: "ConfigMap"},
			Resource: metav1.GroupVersionResource{Version: "v1", Resource: "configmaps"}, Name: "out", Namespace: ns,
			Operation: admissionv1.Update, UserInfo: authenticationv1.UserInfo{Username: "bench"},
			Object: newObj, OldObject: oldObj,
		},
	}
	body, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// TestAdmissionThroughput sends AdmissionReviews straight to the webhook
// server of a manager running as its own process (TLS over HTTP/2 as the
// apiserver sends them, the real handler on the mutating path the apiserver
// calls for an UPDATE, the Lease from the informer cache, the live token
// read from etcd) at concurrency 1 to 64, 3 s each. Each row also reports
// the manager's side from its metrics and /proc: the handler's mean time,
// the live-token read's, and the manager's CPU per review.
func TestAdmissionThroughput(t *testing.T) {
	mgr := webhookManager(t)
	ns, token := heldLease(t, "adm")
	body := review(t, ns, "adm", token)
	wh := fx.Env.WebhookInstallOptions
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(wh.LocalServingCAData)
	url := fmt.Sprintf("https://%s:%d%s", wh.LocalServingHost, wh.LocalServingPort, webhook.RecordPath)

	fmt.Printf("\nAdmission straight to the webhook (AdmissionReview UPDATE of a fenced ConfigMap, live token, 3 s per row; manager in its own process)\n")
	fmt.Printf("%11s %12s %9s %9s %9s %13s %13s %12s\n", "concurrency", "reviews/s", "p50", "p99", "p99.9", "handler mean", "lookup mean", "CPU/review")
	for _, c := range []int{1, 4, 16, 64} {
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, MaxIdleConnsPerHost: c, ForceAttemptHTTP2: true}}
		// Warm the connections and the webhook's caches.
		for range c {
			post(t, hc, url, body)
		}
		before := mgr.sample(t)
		profileDone := mgr.profile(t, fmt.Sprintf("admission-c%d", c), 3)
		s, rate := load(t, hc, url, body, c)
		<-profileDone
		side := mgr.sample(t).since(before)
		perReview := time.Duration(float64(side.cpu) / (rate * 3))
		fmt.Printf("%11d %12.0f %9s %9s %9s %13s %13s %12s\n", c, rate, quantile(s, 0.5).Round(time.Microsecond), quantile(s, 0.99).Round(time.Microsecond), quantile(s, 0.999).Round(time.Microsecond),
			side.handler.Round(time.Microsecond), side.lookup.Round(time.Microsecond), perReview.Round(time.Microsecond))
		record(t, fmt.Sprintf("AdmissionWebhook/concurrency=%d", c), fmt.Sprintf("%.0f", rate), "reviews/s",
			quantile(s, 0.5).Microseconds(), "p50-us", quantile(s, 0.99).Microseconds(), "p99-us",
			side.handler.Microseconds(), "handler-us", side.lookup.Microseconds(), "lookup-us", perReview.Microseconds(), "cpu-us/review")
		hc.CloseIdleConnections()
	}

	// The same reviews to the floor webhook (test/bench/floorwebhook): net/http
	// with TLS and HTTP/2, decoding the review and returning fencer's patch,
	// with no decision and no etcd read. What it serves is the most any
	// webhook can on this machine with this load generator.
	floor := "https://" + startFloor(t) + "/patch"
	fmt.Printf("the floor: a no-op webhook in its own process, same reviews, 3 s per row\n")
	fmt.Printf("%11s %12s %9s %9s %9s\n", "concurrency", "reviews/s", "p50", "p99", "p99.9")
	for _, c := range []int{1, 4, 16} {
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, MaxIdleConnsPerHost: c, ForceAttemptHTTP2: true}}
		for range c {
			post(t, hc, floor, body)
		}
		s, rate := load(t, hc, floor, body, c)
		fmt.Printf("%11d %12.0f %9s %9s %9s\n", c, rate, quantile(s, 0.5).Round(time.Microsecond), quantile(s, 0.99).Round(time.Microsecond), quantile(s, 0.999).Round(time.Microsecond))
		record(t, fmt.Sprintf("AdmissionFloor/concurrency=%d", c), fmt.Sprintf("%.0f", rate), "reviews/s",
			quantile(s, 0.5).Microseconds(), "p50-us", quantile(s, 0.99).Microseconds(), "p99-us")
		hc.CloseIdleConnections()
	}
}

// load posts body to url from c goroutines for 3 s and returns the sorted
// latencies and the rate.
func load(t *testing.T, hc *http.Client, url string, body []byte, c int) ([]time.Duration, float64) {
	return during(t, c, func(int) error { post(t, hc, url, body); return nil })
}

func post(t *testing.T, hc *http.Client, url string, body []byte) {
	resp, err := hc.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Error(err)
		return
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(raw, &out); err != nil || out.Response == nil || !out.Response.Allowed {
		t.Errorf("the webhook did not allow the live token: %s", raw)
	}
}

// TestAdmissionEndToEnd updates a fenced and an unfenced ConfigMap through
// the apiserver, one write at a time, and compares their latencies: the
// cost fencing adds to a write, webhook call and live-token read included.
func TestAdmissionEndToEnd(t *testing.T) {
	mgr := webhookManager(t)
	ns, token := heldLease(t, "e2e")
	ctx := context.Background()
	fenced := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "fenced", Namespace: ns,
		Labels:      map[string]string{"fencer.io/lease": "e2e"},
		Annotations: map[string]string{"fencer.io/token": strconv.FormatInt(token, 10)}}}
	plain := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "plain", Namespace: ns}}
	for _, cm := range []*corev1.ConfigMap{fenced, plain} {
		if err := fx.Client.Create(ctx, cm); err != nil {
			t.Fatal(err)
		}
	}
	floorAllow, floorPatch, floorAddr := floorWebhook(t, ns)
	const n = 400
	// Every fenced write must send the token itself: the SDK's client adds
	// it to each patch body, as a holder's writes do. The floor's writes
	// send an offer of the same size for its webhook to move.
	holder := fence.NewClient(fx.Client, fence.Token{Lease: "e2e", Value: token})
	offer := fmt.Sprintf(`"metadata":{"annotations":{%q:"%d"}},`, floorOffered, token)
	measure := func(c client.Client, cm *corev1.ConfigMap, i int) time.Duration {
		body := fmt.Appendf(nil, `{"data":{"v":"%d"}}`, i)
		if cm.Labels[floorLabel] != "" {
			body = fmt.Appendf(nil, `{%s"data":{"v":"%d"}}`, offer, i)
		}
		s := time.Now()
		if err := c.Patch(ctx, cm, client.RawPatch(types.MergePatchType, body)); err != nil {
			t.Fatal(err)
		}
		return time.Since(s)
	}
	var f, p, fa, fp []time.Duration
	for i := range 20 { // warm-up, not measured
		measure(holder, fenced, i)
		measure(fx.Client, plain, i)
		measure(fx.Client, floorAllow, i)
		measure(fx.Client, floorPatch, i)
	}
	if _, ok := floorPatch.Annotations[floorOffered]; ok || floorPatch.Annotations[floorWritten] == "" {
		t.Fatalf("the floor webhook did not patch its ConfigMap: annotations %v", floorPatch.Annotations)
	}
	if allowed, _ := floorCalls(t, floorAddr); allowed < 20 {
		t.Fatalf("the floor webhook's /allow served %d of the 20 warm-up writes", allowed)
	}
	before, apiBefore := mgr.sample(t), apiserverWebhookTime(t)
	for i := range n { // interleaved, so all see the same machine
		f = append(f, measure(holder, fenced, i))
		p = append(p, measure(fx.Client, plain, i))
		fa = append(fa, measure(fx.Client, floorAllow, i))
		fp = append(fp, measure(fx.Client, floorPatch, i))
	}
	side, api := mgr.sample(t).since(before), apiserverWebhookTime(t).since(apiBefore)
	fs, ps, fas, fps := sorted(f), sorted(p), sorted(fa), sorted(fp)
	fmt.Printf("\nEnd to end through the apiserver: %d sequential merge-patches each, interleaved, after 20 of warm-up\n", n)
	fmt.Printf("%-38s %9s %9s %18s\n", "ConfigMap", "p50", "p99", "median / unfenced")
	for _, row := range []struct {
		name string
		lat  []time.Duration
	}{{"unfenced", ps}, {"floor: no-op webhook, allow", fas}, {"floor: no-op webhook, fencer's patch", fps}, {"fenced", fs}} {
		fmt.Printf("%-38s %9s %9s %18.2f\n", row.name, quantile(row.lat, 0.5).Round(time.Microsecond), quantile(row.lat, 0.99).Round(time.Microsecond),
			float64(quantile(row.lat, 0.5))/float64(quantile(ps, 0.5)))
	}
	r50 := float64(quantile(fs, 0.5)) / float64(quantile(ps, 0.5))
	r99 := float64(quantile(fs, 0.99)) / float64(quantile(ps, 0.99))
	fmt.Printf("fenced/unfenced: median %.2f, p99 %.2f; fenced/floor (fencer's patch): median %.2f\n", r50, r99, float64(quantile(fs, 0.5))/float64(quantile(fps, 0.5)))
	fmt.Printf("where a fenced write's time goes, means: the apiserver's webhook call %s (apiserver_admission_webhook_admission_duration_seconds, record.fencer.io), the handler %s, its live-token read %s; manager CPU %s per write\n",
		api.Round(time.Microsecond), side.handler.Round(time.Microsecond), side.lookup.Round(time.Microsecond), time.Duration(float64(side.cpu)/n).Round(time.Microsecond))
	record(t, "AdmissionEndToEnd/fenced-parts", api.Microseconds(), "apiserver-webhook-us", side.handler.Microseconds(), "handler-us", side.lookup.Microseconds(), "lookup-us")
	record(t, "AdmissionEndToEnd/unfenced", quantile(ps, 0.5).Microseconds(), "p50-us", quantile(ps, 0.99).Microseconds(), "p99-us")
	record(t, "AdmissionEndToEnd/fenced", quantile(fs, 0.5).Microseconds(), "p50-us", quantile(fs, 0.99).Microseconds(), "p99-us")
	record(t, "AdmissionEndToEnd/floor-allow", quantile(fas, 0.5).Microseconds(), "p50-us", quantile(fas, 0.99).Microseconds(), "p99-us")
	record(t, "AdmissionEndToEnd/floor-patch", quantile(fps, 0.5).Microseconds(), "p50-us", quantile(fps, 0.99).Microseconds(), "p99-us")
	record(t, "AdmissionEndToEnd/ratio", fmt.Sprintf("%.3f", r50), "median-ratio", fmt.Sprintf("%.3f", r99), "p99-ratio")
	record(t, "AdmissionEndToEnd/floor-ratio", fmt.Sprintf("%.3f", float64(quantile(fps, 0.5))/float64(quantile(ps, 0.5))), "median-ratio")
}

// The floor webhook's label and annotations (test/bench/floorwebhook).
const (
	floorLabel   = "bench.fencer.io/floor"
	floorOffered = "bench.fencer.io/token"
	floorWritten = "bench.fencer.io/written-token"
)

// floorWebhook runs test/bench/floorwebhook as its own process, with the
// envtest serving certificate, registers it as a mutating webhook for
// ConfigMaps labelled bench.fencer.io/floor (allow: /allow, patch: /patch),
// and returns one such ConfigMap of each in ns.
func floorWebhook(t *testing.T, ns string) (allow, patch *corev1.ConfigMap, addr string) {
	t.Helper()
	addr = startFloor(t)
	wh := fx.Env.WebhookInstallOptions
	ctx := context.Background()
	hook := func(path string) admissionregistrationv1.MutatingWebhook {
		url := "https://" + addr + "/" + path
		none := admissionregistrationv1.SideEffectClassNone
		return admissionregistrationv1.MutatingWebhook{
			Name:                    path + ".floor.bench.fencer.io",
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: wh.LocalServingCAData},
			Rules:                   []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Update}, Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}}}},
			ObjectSelector:          &metav1.LabelSelector{MatchLabels: map[string]string{floorLabel: path}},
			SideEffects:             &none,
			AdmissionReviewVersions: []string{"v1"},
			FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
		}
	}
	cfg := &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "floor.bench.fencer.io"},
		Webhooks: []admissionregistrationv1.MutatingWebhook{hook("allow"), hook("patch")}}
	if err := fx.Client.Create(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fx.Client.Delete(ctx, cfg) })
	cm := func(path string) *corev1.ConfigMap {
		c := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "floor-" + path, Namespace: ns, Labels: map[string]string{floorLabel: path},
			Annotations: map[string]string{"bench.fencer.io/floor": "true"}}}
		if err := fx.Client.Create(ctx, c); err != nil {
			t.Fatal(err)
		}
		return c
	}
	allow, patch = cm("allow"), cm("patch")
	// Until the apiserver reaches the webhook (it starts, and the
	// configuration is loaded), a write fails closed.
	waitAll(t, 60*time.Second, func() (int, error) {
		if err := fx.Client.Patch(ctx, patch, client.RawPatch(types.MergePatchType, fmt.Appendf(nil, `{"metadata":{"annotations":{%q:"0"}}}`, floorOffered))); err != nil {
			return 0, nil
		}
		if _, ok := patch.Annotations[floorOffered]; ok {
			return 0, nil // written before the apiserver loaded the configuration
		}
		return 1, nil
	}, 1)
	return allow, patch, addr
}

// floorCalls is how many reviews the floor webhook served on /allow and
// /patch.
func floorCalls(t *testing.T, addr string) (allow, patch int) {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(fx.Env.WebhookInstallOptions.LocalServingCAData)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	resp, err := hc.Get("https://" + addr + "/calls")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if _, err := fmt.Fscan(resp.Body, &allow, &patch); err != nil {
		t.Fatal(err)
	}
	return allow, patch
}

// startFloor builds and runs test/bench/floorwebhook as its own process,
// serving with the envtest serving certificate, and returns its address.
func startFloor(t *testing.T) string {
	addr, _ := startFloorProcess(t)
	return addr
}

// startFloorProcess is startFloor, also returning the floor's process ID,
// whose CPU time the bench reads.
func startFloorProcess(t *testing.T) (string, int) {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "floorwebhook")
	if out, err := exec.Command("go", "build", "-C", root, "-o", bin, "./test/bench/floorwebhook").CombinedOutput(); err != nil {
		t.Fatalf("building the floor webhook: %v\n%s", err, out)
	}
	ports, err := devcluster.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	wh := fx.Env.WebhookInstallOptions
	addr := fmt.Sprintf("%s:%d", wh.LocalServingHost, ports[0])
	cmd := exec.Command(bin, "-addr="+addr, "-cert-dir="+wh.LocalServingCertDir)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	// Until it listens, /calls fails.
	waitAll(t, 30*time.Second, func() (int, error) {
		conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // only whether it listens
		if err != nil {
			return 0, nil
		}
		conn.Close()
		return 1, nil
	}, 1)
	return addr, cmd.Process.Pid
}
