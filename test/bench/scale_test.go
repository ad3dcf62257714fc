package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/test/support/devcluster"
	"github.com/fencer-io/fencer/test/support/framework"
	"github.com/fencer-io/fencer/test/support/testenv"
)

// scaleRun is one size, with the manager's flags.
type scaleRun struct {
	leases int
	flags  []string
}

// tuned raises the manager's client-side API limits, which bound a burst
// of grants (two writes each) at the defaults.
var tuned = []string{"--kube-api-qps=1000", "--kube-api-burst=2000", "--lease-workers=16"}

// scaleRuns are the runs; SCALE_LEASES (comma-separated counts) replaces
// them with tuned runs of those sizes.
func scaleRuns() []scaleRun {
	if s := os.Getenv("SCALE_LEASES"); s != "" {
		var out []scaleRun
		for _, f := range strings.Split(s, ",") {
			if n, err := strconv.Atoi(f); err == nil && n > 0 {
				out = append(out, scaleRun{n, tuned})
			}
		}
		return out
	}
	return []scaleRun{{1000, nil}, {1000, tuned}, {10000, tuned}}
}

// TestScale runs the manager as its own process against a fresh apiserver
// and etcd per size: n Ready pods and n Leases (ttlSeconds 15, one pod
// each). It reports the time until all are held, then, in steady state
// over 30 s, the manager's CPU and RSS and etcd's request rate. With 1,000
// Leases it also times a Blocks IDRange over the same 1,000 pods.
func TestScale(t *testing.T) {
	bin := managerBinary(t)
	fmt.Printf("\nScale: n Leases (ttlSeconds 15), one Ready pod each; manager as its own process; tokenDelivery %q (SCALE_DELIVERY; empty: the default, PodAnnotations); Lease finalizer set at create by lease-finalizer.fencer.io, none with SCALE_LEASE_DELETE_WEBHOOK=1 (here: %q)\n",
		os.Getenv("SCALE_DELIVERY"), os.Getenv("SCALE_LEASE_DELETE_WEBHOOK"))
	fmt.Printf("%7s %-8s %12s %12s %14s %10s %12s %14s\n", "leases", "limits", "create", "all held", "steady CPU", "RSS", "max RSS", "etcd req/s")
	for _, r := range scaleRuns() {
		scaleOnce(t, bin, r)
	}
	fmt.Printf("limits: default = --kube-api-qps=50 --kube-api-burst=100 --lease-workers=16; tuned = %s\n", strings.Join(tuned, " "))
}

func scaleOnce(t *testing.T, bin string, run scaleRun) {
	n := run.leases
	// Only the processes started for this run count in its CPU split, not
	// the shared fixture's idle control plane.
	before := processCPU(nil)
	webhooks := os.Getenv("SCALE_WEBHOOKS") != "0"
	f, err := framework.StartFencer(webhooks)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Stop()
	ctx := context.Background()
	// The test's own client must not be what limits the run.
	fast := rest.CopyConfig(f.Config)
	fast.QPS, fast.Burst = 5000, 10000
	if f.Client, err = client.New(fast, client.Options{Scheme: f.Env.Scheme}); err != nil {
		t.Fatal(err)
	}
	ns := "scale"
	if err := f.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	parallel(n, 16, func(i int) error {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p%d", i), Namespace: ns,
			Labels: map[string]string{"app": "scale", "lease": fmt.Sprintf("l%d", i)}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}}}
		if err := f.Client.Create(ctx, p); err != nil {
			return err
		}
		p.Status.Phase = corev1.PodRunning
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}}
		return f.Client.Status().Update(ctx, p)
	})

	bare := bareCreates(t, ctx, f.Client, n)
	ports, err := devcluster.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	metricsAddr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	flags := []string{"--metrics-bind-address=" + metricsAddr, "--metrics-secure=false"}
	if webhooks {
		wh := f.Env.WebhookInstallOptions
		flags = append(flags, "--webhook-host="+wh.LocalServingHost, fmt.Sprintf("--webhook-port=%d", wh.LocalServingPort), "--webhook-cert-dir="+wh.LocalServingCertDir)
		// The opt-in release at the DELETE: no finalizer on the run's Leases.
		// (The run deletes no Lease the webhook would receive.)
		if os.Getenv("SCALE_LEASE_DELETE_WEBHOOK") == "1" {
			flags = append(flags, "--lease-delete-webhook")
		}
	}
	mgr := startManager(t, f, bin, append(flags, run.flags...)...)
	mgr.metrics = "http://" + metricsAddr + "/metrics"
	defer mgr.stop()
	watching, stopWatching := context.WithCancel(ctx)
	defer stopWatching()
	held := countHeld(t, watching, fast, ns)
	writes0 := apiserverWrites(t, f.Config)
	procs0 := processCPU(before)
	apiserverProfile := profileAPIServer(t, f.Config, fmt.Sprintf("scale-%d-apiserver-cpu.pprof", n))
	start := time.Now()
	parallel(n, 16, func(i int) error {
		return f.Client.Create(ctx, scaleLease(ns, i))
	})
	created := time.Since(start)
	waitAll(t, 15*time.Minute, func() (int, error) { return held(), nil }, n)
	allHeld := time.Since(start)
	stopWatching()
	<-apiserverProfile
	burst := processCPU(before).minus(procs0)
	fmt.Printf("%7s CPU during the burst, of %.0f core-s (%d cores): %s\n", "", float64(runtime.NumCPU())*allHeld.Seconds(), runtime.NumCPU(), burst)
	fmt.Printf("%7s T_bare (the same %d Lease creates, manager stopped): %s; all held / T_bare = %.2f×; webhooks installed: %v\n", "",
		n, bare.Round(time.Millisecond), allHeld.Seconds()/bare.Seconds(), webhooks)
	// The manager's writes per grant: everything written during the burst
	// but the test's own n Lease creations.
	writes := apiserverWrites(t, f.Config).minus(writes0)
	writes["POST leases"] -= float64(n)
	perGrant := writes.total() / float64(n)
	fmt.Printf("%7s apiserver writes per grant: %.2f (%s)\n", "", perGrant, writes)
	if os.Getenv("SCALE_DEBUG") != "" {
		var list fencerv1.LeaseList
		_ = f.Client.List(ctx, &list, client.InNamespace(ns))
		messages := map[string]int{}
		for _, l := range list.Items {
			t.Logf("%s created %s acquired %s", l.Name, l.CreationTimestamp.Format("15:04:05.000"), l.Status.AcquireTime.Format("15:04:05.000"))
			if c := meta.FindStatusCondition(l.Status.Conditions, fencerv1.ConditionHeld); c != nil {
				messages[strings.Join(strings.Fields(c.Message)[:2], " ")]++
			}
		}
		fmt.Printf("%7s Held condition messages: %v\n", "", messages)
	}

	time.Sleep(10 * time.Second) // past the grant burst
	cpu0, _ := mgr.cpu()
	steady0, reconciles0 := apiserverWrites(t, f.Config), mgr.reconciles(t)
	req0, err := etcdRequests(f.Etcd.MetricsURL)
	if err != nil {
		t.Fatal(err)
	}
	const window = 30 * time.Second
	if dir := os.Getenv("SCALE_PROFILE_DIR"); dir != "" {
		// The steady window doubles as a CPU profile of the manager.
		if err := fetch(mgr.pprof+"/debug/pprof/profile?seconds=30", filepath.Join(dir, fmt.Sprintf("scale-%d-cpu.pprof", n))); err != nil {
			t.Fatal(err)
		}
	} else {
		time.Sleep(window)
	}
	cpu1, _ := mgr.cpu()
	steady, reconciles := apiserverWrites(t, f.Config).minus(steady0), mgr.reconciles(t)-reconciles0
	if dir := os.Getenv("SCALE_PROFILE_DIR"); dir != "" {
		if err := fetch(mgr.pprof+"/debug/pprof/heap", filepath.Join(dir, fmt.Sprintf("scale-%d-heap.pprof", n))); err != nil {
			t.Fatal(err)
		}
	}
	req1, err := etcdRequests(f.Etcd.MetricsURL)
	if err != nil {
		t.Fatal(err)
	}
	rss, hwm := mgr.rss()
	if dir := os.Getenv("SCALE_DEBUG"); dir != "" {
		// The manager's metrics and log, for a look at what it did.
		if err := fetch(mgr.metrics, filepath.Join(dir, fmt.Sprintf("scale-%d-metrics.txt", n))); err != nil {
			t.Error(err)
		}
		if raw, err := os.ReadFile(mgr.log); err == nil {
			_ = os.WriteFile(filepath.Join(dir, fmt.Sprintf("scale-%d-manager.log", n)), raw, 0o644)
		}
	}
	fmt.Printf("%7s steady: %.1f Lease reconciles/s; apiserver writes/s: %.1f (%s in %s)\n", "", reconciles/window.Seconds(),
		steady.total()/window.Seconds(), steady, window)
	cores := (cpu1 - cpu0).Seconds() / window.Seconds()
	reqs := (req1 - req0) / window.Seconds()
	limits := "default"
	if len(run.flags) > 0 {
		limits = "tuned"
	}
	fmt.Printf("%7d %-8s %12s %12s %9.3f core %7d MiB %8d MiB %14.0f\n", n, limits, created.Round(time.Millisecond), allHeld.Round(time.Millisecond), cores, rss>>20, hwm>>20, reqs)
	record(t, fmt.Sprintf("Scale/leases=%d/limits=%s", n, limits), fmt.Sprintf("%.1f", allHeld.Seconds()), "all-held-s",
		fmt.Sprintf("%.3f", cores), "steady-cores", rss>>20, "rss-MiB", fmt.Sprintf("%.0f", reqs), "etcd-req/s", fmt.Sprintf("%.2f", perGrant), "writes/grant",
		fmt.Sprintf("%.1f", bare.Seconds()), "t-bare-s", fmt.Sprintf("%.2f", allHeld.Seconds()/bare.Seconds()), "held/t-bare")

	if n == 1000 && len(run.flags) > 0 {
		idStart := time.Now()
		if err := f.Client.Create(ctx, &fencerv1.IDRange{ObjectMeta: metav1.ObjectMeta{Name: "ids", Namespace: ns},
			Spec: fencerv1.IDRangeSpec{Mode: fencerv1.ModeBlocks, Min: 0, Max: 1 << 62, BlockSize: ptr.To[int64](1000),
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "scale"}}}}); err != nil {
			t.Fatal(err)
		}
		waitAll(t, 10*time.Minute, func() (int, error) {
			var pods corev1.PodList
			if err := f.Client.List(ctx, &pods, client.InNamespace(ns)); err != nil {
				return 0, err
			}
			got := 0
			for _, p := range pods.Items {
				if p.Annotations["idrange.fencer.io/ids"] != "" {
					got++
				}
			}
			return got, nil
		}, n)
		took := time.Since(idStart)
		fmt.Printf("%7s 1,000 IDRange pods (Blocks): all have a block %s after the IDRange was created\n", "", took.Round(time.Millisecond))
		record(t, "Scale/idrange-pods=1000", fmt.Sprintf("%.1f", took.Seconds()), "all-annotated-s")
	}
}

// scaleLease is the run's Lease i: ttlSeconds 15, selecting pod i, with
// the token delivery SCALE_DELIVERY names (LeaseStatus: no pod patch per
// grant; default PodAnnotations).
func scaleLease(ns string, i int) *fencerv1.Lease {
	return &fencerv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("l%d", i), Namespace: ns},
		Spec: fencerv1.LeaseSpec{TTLSeconds: 15, TokenDelivery: fencerv1.TokenDelivery(os.Getenv("SCALE_DELIVERY")),
			HolderSelector: metav1.LabelSelector{MatchLabels: map[string]string{"lease": fmt.Sprintf("l%d", i)}}}}
}

// bareCreates is T_bare: the time the apiserver takes for n bare Lease
// creates with no manager running, sent as the run's creates are (the same
// client, 16 at a time), into a namespace of their own. Their creates skip
// the webhook lease-finalizer.fencer.io, which the run's creates call: a
// cost of fencer's, counted against it.
// They are deleted again before the manager starts, so the run's figures
// do not include them. The namespace is kube-system, which the Lease
// deletion webhook skips: with no manager running, nothing would answer it.
func bareCreates(t *testing.T, ctx context.Context, c client.Client, n int) time.Duration {
	t.Helper()
	const ns = "kube-system"
	start := time.Now()
	parallel(n, 16, func(i int) error {
		return c.Create(ctx, scaleLease(ns, i))
	})
	took := time.Since(start)
	if err := c.DeleteAllOf(ctx, &fencerv1.Lease{}, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	waitAll(t, 5*time.Minute, func() (int, error) {
		var left fencerv1.LeaseList
		if err := c.List(ctx, &left, client.InNamespace(ns)); err != nil {
			return 0, err
		}
		return n - len(left.Items), nil
	}, n)
	return took
}

// parallel runs fn(0..n-1) on workers goroutines, stopping the test on error.
func parallel(n, workers int, fn func(i int) error) {
	next := make(chan int)
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	for range workers {
		wg.Go(func() {
			for i := range next {
				if err := fn(i); err != nil {
					once.Do(func() { first = err })
				}
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	if first != nil {
		panic(first)
	}
}

type manager struct {
	cmd     *exec.Cmd
	log     string
	pprof   string // base URL of its pprof endpoints
	metrics string // its /metrics, when served
}

// get returns url's body.
func get(url string) (string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	return string(raw), err
}

// fetch saves url's body to path.
func fetch(url, path string) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(f, resp.Body)
	return err
}

// chartMemoryLimit is the chart's default memory limit for the manager
// (values.yaml resources.limits.memory), which it also gives as GOMEMLIMIT.
const chartMemoryLimit = "512MiB"

// writeCounts are the apiserver's write requests by "VERB resource".
type writeCounts map[string]float64

// apiserverWrites reads apiserver_request_total for POST, PUT, PATCH and
// DELETE, by verb and resource.
func apiserverWrites(t *testing.T, cfg *rest.Config) writeCounts {
	t.Helper()
	out := writeCounts{}
	for _, m := range apiserverMetrics(t, cfg)["apiserver_request_total"].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		switch labels["verb"] {
		case "POST", "PUT", "PATCH", "DELETE":
			// The apiserver renews its own identity Lease
			// (coordination.k8s.io) every 10 s; those writes are not
			// fencer's, whose leader election is in its etcd.
			if labels["group"] == "coordination.k8s.io" {
				continue
			}
			key := labels["verb"] + " " + labels["resource"]
			if labels["subresource"] != "" {
				key += "/" + labels["subresource"]
			}
			// Refused writes (a conflict, 409) are writes too, but show
			// apart: they are what a stale cache costs.
			if code := labels["code"]; code != "" && code[0] != '2' {
				key += " " + code
			}
			out[key] += m.GetCounter().GetValue()
		}
	}
	return out
}

func (w writeCounts) minus(b writeCounts) writeCounts {
	out := writeCounts{}
	for k, v := range w {
		if d := v - b[k]; d > 0 {
			out[k] = d
		}
	}
	return out
}

func (w writeCounts) total() float64 {
	var sum float64
	for _, v := range w {
		sum += v
	}
	return sum
}

func (w writeCounts) String() string {
	keys := make([]string, 0, len(w))
	for k := range w {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		if w[k] >= 1 {
			parts = append(parts, fmt.Sprintf("%s %.0f", k, w[k]))
		}
	}
	return strings.Join(parts, ", ")
}

func startManager(t *testing.T, f *framework.Fencer, bin string, flags ...string) *manager {
	t.Helper()
	// The manager runs under the tests' own user name, the one the status
	// guard (installed by framework.StartFencer) admits as fencer's manager:
	// under any other name its status writes are refused.
	name, err := testenv.Username(context.Background(), f.Client)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := f.Env.AddUser(envtest.User{Name: name, Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := admin.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	kc := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kc, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	ports, err := devcluster.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	probe, pprof := fmt.Sprintf("127.0.0.1:%d", ports[0]), fmt.Sprintf("127.0.0.1:%d", ports[1])
	log, err := os.Create(filepath.Join(dir, "manager.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, append([]string{"--kubeconfig=" + kc, "--leader-elect=false",
		"--webhook-port=0", "--metrics-bind-address=0", "--health-probe-bind-address=" + probe, "--pprof-bind-address=" + pprof}, append(f.EtcdFlags(), flags...)...)...)
	cmd.Stdout, cmd.Stderr = log, log
	// The chart sets GOMEMLIMIT to the container's memory limit.
	cmd.Env = append(os.Environ(), "GOMEMLIMIT="+chartMemoryLimit)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	m := &manager{cmd: cmd, log: log.Name(), pprof: "http://" + pprof}
	if err := framework.WaitHTTP(context.Background(), "http://"+probe+"/readyz", http.StatusOK, 60*time.Second); err != nil {
		m.stop()
		t.Fatalf("manager not ready (%v); log in %s", err, log.Name())
	}
	return m
}

func (m *manager) stop() {
	_ = m.cmd.Process.Kill()
	_ = m.cmd.Wait()
}

// cpu is the process's user+system CPU time, from /proc/<pid>/stat.
func (m *manager) cpu() (time.Duration, error) {
	st, err := readStat(fmt.Sprintf("/proc/%d/stat", m.cmd.Process.Pid))
	return st.cpu, err
}

// procStat is what the bench reads of /proc/<pid>/stat.
type procStat struct {
	pid, ppid int
	name      string
	cpu       time.Duration // user + system
}

// readStat parses a /proc/<pid>/stat file.
func readStat(path string) (procStat, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return procStat{}, err
	}
	// The command name is in parentheses and may hold spaces.
	open, shut := strings.IndexByte(string(raw), '('), strings.LastIndexByte(string(raw), ')')
	if open < 0 || shut < open {
		return procStat{}, fmt.Errorf("%s: no command name", path)
	}
	fields := strings.Fields(string(raw[shut+2:]))
	if len(fields) < 13 {
		return procStat{}, fmt.Errorf("%s: %d fields", path, len(fields))
	}
	st := procStat{name: string(raw[open+1 : shut])}
	st.pid, _ = strconv.Atoi(strings.TrimSpace(string(raw[:open])))
	st.ppid, _ = strconv.Atoi(fields[1])
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	st.cpu = time.Duration(utime+stime) * 10 * time.Millisecond // USER_HZ is 100 on Linux
	return st, nil
}

// rss returns the resident and peak resident set sizes, in bytes.
func (m *manager) rss() (rss, hwm int64) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", m.cmd.Process.Pid))
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		kb, _ := strconv.ParseInt(fields[1], 10, 64)
		switch fields[0] {
		case "VmRSS:":
			rss = kb << 10
		case "VmHWM:":
			hwm = kb << 10
		}
	}
	return rss, hwm
}

// etcdRequests is etcd's count of gRPC requests: unary calls handled plus
// stream messages received (keepalives and watch requests).
func etcdRequests(metricsURL string) (float64, error) {
	resp, err := http.Get(metricsURL)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var total float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		unary := strings.HasPrefix(line, "grpc_server_handled_total{") && strings.Contains(line, `grpc_type="unary"`)
		stream := strings.HasPrefix(line, "grpc_server_msg_received_total{") && strings.Contains(line, `grpc_type="bidi_stream"`)
		if !unary && !stream {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			total += v
		}
	}
	return total, sc.Err()
}

// cpuByProcess is CPU time by process: this test's own process ("test")
// and its children (the apiserver, both etcds, the manager), by name and pid.
type cpuByProcess map[string]time.Duration

// processCPU reads it from /proc, leaving out the children in skip.
func processCPU(skip cpuByProcess) cpuByProcess {
	out := cpuByProcess{}
	self := os.Getpid()
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, path := range stats {
		st, err := readStat(path)
		if err != nil {
			continue
		}
		name := st.name
		switch {
		case st.pid == self:
			name = "test"
		case st.ppid != self:
			continue
		default:
			name = fmt.Sprintf("%s[%d]", name, st.pid)
		}
		if _, ok := skip[name]; ok && name != "test" {
			continue
		}
		out[name] += st.cpu
	}
	return out
}

func (c cpuByProcess) minus(b cpuByProcess) cpuByProcess {
	out := cpuByProcess{}
	for k, v := range c {
		out[k] = v - b[k]
	}
	return out
}

func (c cpuByProcess) String() string {
	keys := make([]string, 0, len(c))
	var total time.Duration
	for k, v := range c {
		keys = append(keys, k)
		total += v
	}
	sort.Slice(keys, func(i, j int) bool { return c[keys[i]] > c[keys[j]] })
	parts := make([]string, 0, len(keys)+1)
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %.1f s", k, c[k].Seconds()))
	}
	return strings.Join(append(parts, fmt.Sprintf("total %.1f s", total.Seconds())), ", ")
}

// reconciles is the manager's count of Lease reconciles, whatever their
// result (controller_runtime_reconcile_total).
func (m *manager) reconciles(t *testing.T) float64 {
	t.Helper()
	body, err := get(m.metrics)
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, s := range parseMetrics(t, body)["controller_runtime_reconcile_total"].GetMetric() {
		for _, l := range s.GetLabel() {
			if l.GetName() == "controller" && l.GetValue() == "lease" {
				n += s.GetCounter().GetValue()
			}
		}
	}
	return n
}

// countHeld follows the Leases of ns with one watch, as `kubectl get -w`
// would, and returns a count of those holding a token. Polling a LIST of
// every Lease instead, as this bench once did, cost the apiserver more CPU
// than the grants it was timing.
func countHeld(t *testing.T, ctx context.Context, cfg *rest.Config, ns string) func() int {
	t.Helper()
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: fx.Env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	held := map[string]bool{}
	note := func(l *fencerv1.Lease, gone bool) {
		mu.Lock()
		held[l.Name] = !gone && l.Status.Token != 0
		mu.Unlock()
	}
	// A LIST for the resourceVersion, then a watch from it; again if the
	// apiserver ends the watch.
	follow := func() error {
		var list fencerv1.LeaseList
		if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return err
		}
		for i := range list.Items {
			note(&list.Items[i], false)
		}
		w, err := c.Watch(ctx, &fencerv1.LeaseList{}, client.InNamespace(ns), &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.ResourceVersion}})
		if err != nil {
			return err
		}
		defer w.Stop()
		for ev := range w.ResultChan() {
			if l, ok := ev.Object.(*fencerv1.Lease); ok {
				note(l, ev.Type == watch.Deleted)
			}
		}
		return nil
	}
	go func() {
		for ctx.Err() == nil {
			if err := follow(); err != nil && ctx.Err() == nil {
				time.Sleep(time.Second)
			}
		}
	}()
	return func() int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, h := range held {
			if h {
				n++
			}
		}
		return n
	}
}

// profileAPIServer saves a 30 s CPU profile of the apiserver to
// $SCALE_PROFILE_DIR/name, when that is set, from the apiserver's own
// /debug/pprof (on by default); the channel closes when it is done.
func profileAPIServer(t *testing.T, cfg *rest.Config, name string) <-chan struct{} {
	done := make(chan struct{})
	dir := os.Getenv("SCALE_PROFILE_DIR")
	if dir == "" {
		close(done)
		return done
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(done)
		raw, err := cs.Discovery().RESTClient().Get().AbsPath("/debug/pprof/profile").Param("seconds", "30").DoRaw(context.Background())
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, name), raw, 0o644)
		}
		if err != nil {
			t.Errorf("profiling the apiserver: %v", err)
		}
	}()
	return done
}
