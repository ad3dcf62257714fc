package bench

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	admissionv1 "k8s.io/api/admission/v1"

	"github.com/fencer-io/fencer/internal/webhook"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
)

// TestAdmissionAgainstItsFloors measures, in one run, the rows the
// webhook's targets are stated against (docs/performance.md):
//
//   - read: the linearizable read the webhook makes for a review (the lease
//     key and its grant marker in one transaction), from this process at
//     the same concurrency: no webhook can accept a write faster than it;
//   - c=16 spread over 16 Leases, fencer and the floor webhook, with each
//     one's CPU per review;
//   - HTTP/1.1 against HTTP/2, fencer and the floor, at c=4;
//   - a flood of stale tokens (16 clients) beside one holder: the holder's
//     latency with the flood sent to fencer and with the same flood sent to
//     the floor, and the etcd reads fencer made per refused review.
func TestAdmissionAgainstItsFloors(t *testing.T) {
	mgr := webhookManager(t)
	floorAddr, floorPID := startFloorProcess(t)
	floor := "https://" + floorAddr + "/patch"
	wh := fx.Env.WebhookInstallOptions
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(wh.LocalServingCAData)
	url := fmt.Sprintf("https://%s:%d%s", wh.LocalServingHost, wh.LocalServingPort, webhook.RecordPath)
	client := func(c int, h2 bool) *http.Client {
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, MaxIdleConnsPerHost: c, ForceAttemptHTTP2: h2}
		if !h2 {
			tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{} // HTTP/1.1 only
		}
		return &http.Client{Transport: tr}
	}
	var bodies [][]byte
	var leases []lease
	for i := range 16 {
		name := fmt.Sprintf("spread-%d", i)
		ns, token := heldLease(t, name)
		bodies = append(bodies, review(t, ns, name, token))
		leases = append(leases, lease{ns, name, token})
	}

	fmt.Printf("\nAdmission against its floors (AdmissionReview UPDATE of a fenced ConfigMap, 3 s per row; manager and floor webhook each in its own process)\n")
	fmt.Printf("%-40s %12s %9s %9s %12s\n", "row", "per s", "p50", "p99", "CPU/review")
	for _, c := range []int{1, 4, 16} {
		lat, rate := readLoad(t, leases[:1], c)
		row(t, fmt.Sprintf("read (etcd txn), c=%d", c), fmt.Sprintf("AdmissionRead/concurrency=%d", c), lat, rate, 0)
	}
	spread := func(name, key, u string, cpu func() time.Duration, h2 bool, c int, bodies [][]byte) {
		hc := client(c, h2)
		defer hc.CloseIdleConnections()
		for _, b := range bodies {
			post(t, hc, u, b)
		}
		before := cpu()
		var profiled <-chan struct{} // the manager's profile, for fencer's rows
		if u == url {
			profiled = mgr.profile(t, "admission-"+strings.ReplaceAll(key, "/", "-"), 3)
		}
		lat, rate := loadSpread(t, hc, u, bodies, c)
		if profiled != nil {
			<-profiled
		}
		row(t, name, key, lat, rate, time.Duration(float64(cpu()-before)/(rate*3)))
	}
	mgrCPU := func() time.Duration { d, _ := mgr.cpu(); return d }
	floorCPU := func() time.Duration { st, _ := readStat(fmt.Sprintf("/proc/%d/stat", floorPID)); return st.cpu }
	spread("fencer, c=16 over 16 Leases", "AdmissionWebhookSpread/concurrency=16", url, mgrCPU, true, 16, bodies)
	spread("floor, c=16 over 16 Leases", "AdmissionFloorSpread/concurrency=16", floor, floorCPU, true, 16, bodies)
	for _, h2 := range []bool{true, false} {
		proto := map[bool]string{true: "HTTP/2", false: "HTTP/1.1"}[h2]
		spread("fencer, c=4, "+proto, "AdmissionWebhook/"+proto+"/concurrency=4", url, mgrCPU, h2, 4, bodies[:1])
		spread("floor, c=4, "+proto, "AdmissionFloor/"+proto+"/concurrency=4", floor, floorCPU, h2, 4, bodies[:1])
	}
	staleFlood(t, mgr, url, floor, client, leases[0])
}

type lease struct {
	ns, name string
	token    int64
}

// row prints and records one row.
func row(t *testing.T, name, key string, lat []time.Duration, rate float64, cpu time.Duration) {
	cpuText := "-"
	if cpu > 0 {
		cpuText = cpu.Round(time.Microsecond).String()
	}
	fmt.Printf("%-40s %12.0f %9s %9s %12s\n", name, rate, quantile(lat, 0.5).Round(time.Microsecond), quantile(lat, 0.99).Round(time.Microsecond), cpuText)
	record(t, key, fmt.Sprintf("%.0f", rate), "per-s", quantile(lat, 0.5).Microseconds(), "p50-us", quantile(lat, 0.99).Microseconds(), "p99-us", cpu.Microseconds(), "cpu-us/review")
}

// readLoad runs the webhook's linearizable read (the lease key and its
// grant marker in one transaction) from c goroutines for 3 s.
func readLoad(t *testing.T, leases []lease, c int) ([]time.Duration, float64) {
	cli, err := fx.ConnectEtcd()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	return during(t, c, func(i int) error {
		l := leases[i%len(leases)]
		_, err := cli.Txn(context.Background()).Then(
			clientv3.OpGet(etcdkeys.LeaseKey(etcdkeys.DefaultPrefix, l.ns, l.name)),
			clientv3.OpGet(etcdkeys.GrantMarkerKey(etcdkeys.DefaultPrefix, l.ns, l.name))).Commit()
		return err
	})
}

// loadSpread posts bodies round-robin from c goroutines for 3 s, goroutine
// i starting at body i.
func loadSpread(t *testing.T, hc *http.Client, url string, bodies [][]byte, c int) ([]time.Duration, float64) {
	return during(t, c, func(i int) error { post(t, hc, url, bodies[i%len(bodies)]); return nil })
}

// during runs op from c goroutines for 3 s (goroutine g's n-th call gets
// g+n) and returns the sorted latencies and the rate.
func during(t *testing.T, c int, op func(i int) error) ([]time.Duration, float64) {
	var mu sync.Mutex
	var lat []time.Duration
	var count atomic.Int64
	end := time.Now().Add(3 * time.Second)
	start := time.Now()
	var wg sync.WaitGroup
	for g := range c {
		wg.Go(func() {
			var mine []time.Duration
			for n := 0; time.Now().Before(end); n++ {
				s := time.Now()
				if err := op(g + n); err != nil {
					t.Error(err)
					return
				}
				mine = append(mine, time.Since(s))
			}
			count.Add(int64(len(mine)))
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	return sorted(lat), float64(count.Load()) / time.Since(start).Seconds()
}

// staleFlood sends one holder's reviews (c=1) while 16 clients send
// reviews under a token below the one the Lease's status records: first
// with the flood to fencer, then with the same flood to the floor webhook.
// It reports the holder's latency under each, and the etcd reads fencer
// made per refused review.
func staleFlood(t *testing.T, mgr *manager, url, floor string, client func(int, bool) *http.Client, l lease) {
	holder := review(t, l.ns, l.name, l.token)
	stale := review(t, l.ns, l.name, l.token-1)
	for _, to := range []struct{ name, key, url string }{{"fencer", "Fencer", url}, {"the floor", "Floor", floor}} {
		flood := client(16, true)
		hc := client(1, true)
		post(t, hc, url, holder)
		var refused, sent atomic.Int64
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for range 16 {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					if denied := postStale(t, flood, to.url, stale); denied {
						refused.Add(1)
					}
					sent.Add(1)
				}
			})
		}
		lookups, refusals := mgr.lookupsAndRefusals(t)
		profiled := mgr.profile(t, "admission-flood-to-"+to.key, 3)
		lat, rate := during(t, 1, func(int) error { post(t, hc, url, holder); return nil })
		<-profiled
		lookups2, refusals2 := mgr.lookupsAndRefusals(t)
		close(stop)
		wg.Wait()
		flood.CloseIdleConnections()
		hc.CloseIdleConnections()
		holderReads := rate * 3 // the holder's reviews each read etcd once, at most
		readsPerRefusal := 0.0
		if refusals2 > refusals {
			readsPerRefusal = max(0, (lookups2-lookups)-holderReads) / (refusals2 - refusals)
		}
		fmt.Printf("%-40s %12.0f %9s %9s %12s\n", "holder, c=1, flood of 16 to "+to.name, rate,
			quantile(lat, 0.5).Round(time.Microsecond), quantile(lat, 0.99).Round(time.Microsecond), "-")
		record(t, "AdmissionHolderUnderStaleFlood/to="+to.key, fmt.Sprintf("%.0f", rate), "per-s", quantile(lat, 0.5).Microseconds(), "p50-us",
			quantile(lat, 0.99).Microseconds(), "p99-us")
		if to.url == url {
			fmt.Printf("%-40s %12.0f refused reviews/s, %.3f etcd reads per refused review\n", "  the flood at fencer", float64(refused.Load())/3, readsPerRefusal)
			record(t, "AdmissionStaleFlood", fmt.Sprintf("%.0f", float64(refused.Load())/3), "refused/s", fmt.Sprintf("%.3f", readsPerRefusal), "etcd-reads/refusal")
		}
	}
}

// postStale posts a stale review and reports whether it was refused; the
// floor allows everything.
func postStale(t *testing.T, hc *http.Client, url string, body []byte) bool {
	out, err := postReview(hc, url, body)
	if err != nil {
		t.Error(err)
		return false
	}
	return !out
}

// postReview posts an AdmissionReview and reports whether it was allowed.
func postReview(hc *http.Client, url string, body []byte) (bool, error) {
	resp, err := hc.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	var out admissionv1.AdmissionReview
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return false, fmt.Errorf("no AdmissionReview back (HTTP %d): %w", resp.StatusCode, err)
	}
	if out.Response == nil {
		return false, fmt.Errorf("an AdmissionReview with no response back (HTTP %d)", resp.StatusCode)
	}
	return out.Response.Allowed, nil
}

// lookupsAndRefusals are the manager's live-token reads (etcd reads) and
// refused reviews so far, from its metrics.
func (m *manager) lookupsAndRefusals(t *testing.T) (lookups, refusals float64) {
	t.Helper()
	body, err := get(m.metrics)
	if err != nil {
		t.Fatal(err)
	}
	families := parseMetrics(t, body)
	if f := families["fencer_token_lookup_duration_seconds"]; f != nil {
		for _, s := range f.GetMetric() {
			lookups += float64(s.GetHistogram().GetSampleCount())
		}
	}
	if f := families["fencer_admission_decisions_total"]; f != nil {
		for _, s := range f.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == "refused" {
					refusals += s.GetCounter().GetValue()
				}
			}
		}
	}
	return lookups, refusals
}
