// Package harness runs fencer under faults, all on loopback: a kube-apiserver
// with its own etcd (envtest), a 3-member etcd cluster for fencer, two
// manager replicas as separate processes, and worker processes built on the
// SDK that compete for Leases, write fenced ConfigMaps and etcd keys, and
// issue IDs. Every link from a fencer process to etcd, and the apiserver's
// link to the webhook, runs through a faultproxy, so a nemesis can pause,
// kill, restart and partition any of them. The harness records every history
// the checker (package history) needs.
package harness

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/internal/identity"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
	"github.com/fencer-io/fencer/test/e2e/history"
	"github.com/fencer-io/fencer/test/support/devcluster"
	"github.com/fencer-io/fencer/test/support/faultproxy"
	"github.com/fencer-io/fencer/test/support/framework"
	"github.com/fencer-io/fencer/test/support/testenv"
)

// Namespace holds the workload: worker pods, Leases, IDRanges, ConfigMaps.
const Namespace = "faults"

// systemNamespace holds the managers' service account and election Lease.
const systemNamespace = "fencer-system"

// workloadUID names the workers' etcd user (identity.NamespaceUser).
const workloadUID = "faults-uid"

// Leases the workers compete for: alpha is held by the oldest Ready worker
// of all; beta, among the "b" workers, binds writes to its holder's
// identity. TTLs are short so that faults move them often.
var Leases = []*fencerv1.Lease{
	{ObjectMeta: metav1.ObjectMeta{Name: "alpha", Namespace: Namespace},
		Spec: fencerv1.LeaseSpec{TTLSeconds: 3, HolderSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "worker"}}}},
	{ObjectMeta: metav1.ObjectMeta{Name: "beta", Namespace: Namespace},
		Spec: fencerv1.LeaseSpec{TTLSeconds: 2, BindIdentity: true, Policy: fencerv1.PolicyMonotonic,
			HolderSelector: metav1.LabelSelector{MatchLabels: map[string]string{"group": "b"}}}},
}

// Options configure a run.
type Options struct {
	// BinDir holds the tools (etcd, kube-apiserver).
	BinDir string
	// Dir receives the histories and logs.
	Dir string
	// Fencer and Worker are the manager and worker binaries.
	Fencer, Worker string
	// Workers is how many worker processes (and pods) to run; at least 4.
	Workers int
	// Logf receives progress lines.
	Logf func(format string, args ...any)
	// Database is a PostgreSQL DSN; when set, workers also commit through
	// the database guard, and the nemesis pauses them mid-transaction and
	// kills their sessions.
	Database string
	// Unguarded makes the database workers commit without the guard's
	// compare: the checker's own test.
	Unguarded bool
}

// Harness is a running system under test.
type Harness struct {
	opts    Options
	env     *envtest.Environment
	cfg     *rest.Config
	cl      client.Client
	members []*devcluster.Etcd
	// pki locks fencer's etcd down as the chart does: TLS, client
	// certificates, auth. Managers connect as the manager's user, workers as
	// their namespace's identity.
	pki     *devcluster.EtcdPKI
	etcd    *clientv3.Client
	webhook *faultproxy.Proxy
	// h.webhookPorts are the managers' webhook ports, chosen before the proxy
	// in front of them starts.
	webhookPorts []int

	managers []*process
	workers  []*process
	pods     []*corev1.Pod
	kubelet  *kubelet
	// db is an admin connection to Options.Database, nil without one.
	db *sql.DB

	objects, leases *history.Writer
	faults          *history.Writer
	stopWatch       context.CancelFunc
	watchers        sync.WaitGroup
	watchErr        chan error
	// seenCM and seenLease are the newest resourceVersions the history
	// watches delivered.
	seenCM, seenLease atomic.Int64
	supervise         context.CancelFunc
}

// Start brings everything up and starts the workload. Close it.
func Start(ctx context.Context, o Options) (h *Harness, err error) {
	if o.Workers < 4 {
		o.Workers = 4
	}
	h = &Harness{opts: o, watchErr: make(chan error, 4)}
	defer func() {
		if err != nil {
			h.Close()
		}
	}()
	steps := []struct {
		name string
		fn   func(context.Context) error
	}{
		{"kube-apiserver", h.startAPIServer},
		{"fencer's etcd cluster", h.startEtcd},
		{"database", h.startDatabase},
		{"history watches", h.startWatches},
		{"managers", h.startManagers},
		{"workload", h.startWorkload},
	}
	for _, s := range steps {
		o.Logf("starting %s", s.name)
		if err := s.fn(ctx); err != nil {
			return h, fmt.Errorf("%s: %w", s.name, err)
		}
	}
	var sctx context.Context
	sctx, h.supervise = context.WithCancel(context.Background())
	go h.superviseManagers(sctx)
	return h, nil
}

func (h *Harness) startAPIServer(context.Context) error {
	var err error
	if h.webhookPorts, err = devcluster.FreePorts(2); err != nil {
		return err
	}
	// The apiserver calls the webhook through one proxy, as through a
	// Service: whichever replica answers.
	h.webhook, err = faultproxy.Start(fmt.Sprintf("127.0.0.1:%d", h.webhookPorts[0]), fmt.Sprintf("127.0.0.1:%d", h.webhookPorts[1]))
	if err != nil {
		return err
	}
	_, port, _ := net.SplitHostPort(h.webhook.Addr())
	root, err := testenv.RepoRoot()
	if err != nil {
		return err
	}
	if h.env, err = testenv.New(); err != nil {
		return err
	}
	h.env.WebhookInstallOptions.Paths = []string{filepath.Join(root, "config", "webhook")}
	h.env.WebhookInstallOptions.LocalServingHost = "127.0.0.1"
	h.env.WebhookInstallOptions.LocalServingPort, _ = strconv.Atoi(port)
	if h.cfg, err = h.env.Start(); err != nil {
		return err
	}
	if h.cl, err = client.New(h.cfg, client.Options{Scheme: h.env.Scheme}); err != nil {
		return err
	}
	// The managers run as the chart's service account (startManagers).
	return testenv.InstallPolicies(context.Background(), h.cl, "system:serviceaccount:"+systemNamespace+":fencer")
}

func (h *Harness) startEtcd(ctx context.Context) error {
	var err error
	if h.members, err = devcluster.NewEtcdCluster(h.opts.BinDir, filepath.Join(h.opts.Dir, "etcd"), "fencer-etcd", 3); err != nil {
		return err
	}
	if h.pki, err = devcluster.NewEtcdPKI(filepath.Join(h.opts.Dir, "etcd-pki"), h.Prefix()); err != nil {
		return err
	}
	devcluster.SecureCluster(h.members, h.pki)
	if err := devcluster.StartAll(ctx, h.members); err != nil {
		return err
	}
	if h.etcd, err = h.pki.Client(h.memberURLs(), "manager"); err != nil {
		return err
	}
	// The workers' namespace identity, as the manager's identity controller
	// gives it: its lease keys read-only, its IDRanges and data keys.
	// No identity controller runs here (the managers have no
	// --etcd-pki-secret), so any namespace UID names the user.
	if err := identity.EnsureNamespace(ctx, h.etcd, h.Prefix(), Namespace, workloadUID, nil); err != nil {
		return err
	}
	return h.pki.Issue("workload", identity.Request{CommonName: identity.NamespaceUser(h.Prefix(), Namespace, workloadUID)})
}

// workerCredentials writes what the kubelet would mount from the
// namespace's credentials Secret, with the worker's own proxied endpoints.
func (h *Harness) workerCredentials(name, endpoints string) (string, error) {
	dir := filepath.Join(h.opts.Dir, "workers", name+"-etcd")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	files := map[string][]byte{"ca.crt": h.pki.CA.CertPEM, "endpoints": []byte(endpoints), "prefix": []byte(h.Prefix())}
	for from, to := range map[string]string{"workload.crt": "tls.crt", "workload.key": "tls.key"} {
		raw, err := os.ReadFile(h.pki.Path(from))
		if err != nil {
			return "", err
		}
		files[to] = raw
	}
	for name, raw := range files {
		if err := os.WriteFile(filepath.Join(dir, name), raw, 0o600); err != nil {
			return "", err
		}
	}
	return dir, nil
}

func (h *Harness) memberURLs() []string {
	var urls []string
	for _, m := range h.members {
		urls = append(urls, m.Endpoint)
	}
	return urls
}

// proxies starts one proxy per etcd member for one process and returns
// them with the client URLs to use.
func (h *Harness) proxies() ([]*faultproxy.Proxy, string, error) {
	var ps []*faultproxy.Proxy
	var urls []string
	for _, m := range h.members {
		p, err := faultproxy.Start(strings.TrimPrefix(m.Endpoint, "https://"))
		if err != nil {
			return nil, "", err
		}
		ps = append(ps, p)
		urls = append(urls, "https://"+p.Addr())
	}
	return ps, strings.Join(urls, ","), nil
}

func (h *Harness) startManagers(ctx context.Context) error {
	for _, ns := range []string{systemNamespace, Namespace} {
		if err := h.cl.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			return err
		}
	}
	// The managers run with nothing but the generated least-privilege role.
	if err := framework.BindGeneratedRole(ctx, h.cl, systemNamespace, "fencer", "fencer-e2e"); err != nil {
		return err
	}
	kubeconfig := filepath.Join(h.opts.Dir, "manager.kubeconfig")
	if err := framework.ServiceAccountKubeconfig(ctx, h.cfg, systemNamespace, "fencer", nil, kubeconfig); err != nil {
		return err
	}
	probes, err := devcluster.FreePorts(2)
	if err != nil {
		return err
	}
	for i := range 2 {
		ps, endpoints, err := h.proxies()
		if err != nil {
			return err
		}
		m := &process{
			name: fmt.Sprintf("manager-%d", i), bin: h.opts.Fencer, proxies: ps,
			log: filepath.Join(h.opts.Dir, "logs", fmt.Sprintf("manager-%d.log", i)),
			args: []string{
				"--kubeconfig=" + kubeconfig,
				"--etcd-ca-file=" + h.pki.Path("ca.crt"),
				"--etcd-cert-file=" + h.pki.Path("manager.crt"),
				"--etcd-key-file=" + h.pki.Path("manager.key"),
				"--etcd-endpoints=" + endpoints,
				// The checker replays etcd's whole history from revision 1,
				// which compaction would drop; compaction is tested apart.
				"--etcd-maintenance-interval=0",
				"--leader-election-namespace=" + systemNamespace,
				"--metrics-bind-address=0",
				fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", probes[i]),
				fmt.Sprintf("--webhook-port=%d", h.webhookPorts[i]),
				"--webhook-host=127.0.0.1",
				"--webhook-cert-dir=" + h.env.WebhookInstallOptions.LocalServingCertDir,
			},
		}
		if err := m.start(); err != nil {
			return err
		}
		h.managers = append(h.managers, m)
	}
	for _, port := range probes {
		if err := framework.WaitHTTP(ctx, fmt.Sprintf("http://127.0.0.1:%d/readyz", port), http.StatusOK, 90*time.Second); err != nil {
			return err
		}
	}
	return nil
}

// superviseManagers restarts a manager that exited on its own, as its
// Deployment would; a manager that loses leadership exits by design.
func (h *Harness) superviseManagers(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
		for _, m := range h.managers {
			m.mu.Lock()
			stopped := m.stopped
			m.mu.Unlock()
			if !stopped && !m.running() {
				h.opts.Logf("%s exited; restarting it", m.name)
				if err := m.start(); err != nil {
					h.opts.Logf("restarting %s: %v", m.name, err)
				}
			}
		}
	}
}

// startWorkload creates the worker pods and their RBAC, the Leases and
// IDRanges, and starts the worker processes and their kubelet.
func (h *Harness) startWorkload(ctx context.Context) error {
	if err := h.workerRBAC(ctx); err != nil {
		return err
	}
	h.kubelet = newKubelet(h.cl, h.opts.Logf)
	ports, err := devcluster.FreePorts(h.opts.Workers)
	if err != nil {
		return err
	}
	for i := range h.opts.Workers {
		name := fmt.Sprintf("w-%d", i)
		labels := map[string]string{"app": "worker", "group": "a"}
		if i >= h.opts.Workers/2 {
			labels["group"] = "b"
		}
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: Namespace, Labels: labels},
			Spec: corev1.PodSpec{ServiceAccountName: "worker", NodeName: "harness",
				Containers: []corev1.Container{{Name: "worker", Image: "fencer-e2e-worker"}}},
		}
		if err := h.cl.Create(ctx, pod); err != nil {
			return err
		}
		h.pods = append(h.pods, pod)
		kubeconfig := filepath.Join(h.opts.Dir, "workers", name+".kubeconfig")
		if err := os.MkdirAll(filepath.Dir(kubeconfig), 0o755); err != nil {
			return err
		}
		if err := framework.ServiceAccountKubeconfig(ctx, h.cfg, Namespace, "worker", pod, kubeconfig); err != nil {
			return err
		}
		ps, endpoints, err := h.proxies()
		if err != nil {
			return err
		}
		creds, err := h.workerCredentials(name, endpoints)
		if err != nil {
			return err
		}
		readyAddr := fmt.Sprintf("127.0.0.1:%d", ports[i])
		w := &process{
			name: name, bin: h.opts.Worker, proxies: ps,
			log: filepath.Join(h.opts.Dir, "logs", name+".log"),
			args: []string{
				"--kubeconfig=" + kubeconfig, "--namespace=" + Namespace, "--pod=" + name, "--pod-uid=" + string(pod.UID),
				"--leases=alpha,beta", "--etcd-credentials=" + creds,
				"--idrange=ids", "--slots=slots", "--block-size=1000", "--hostile-every=250ms", "--lock-keys=10",
				"--history=" + filepath.Join(h.opts.Dir, "workers", name+".jsonl"),
				"--ready-addr=" + readyAddr,
			},
		}
		if h.db != nil {
			w.args = append(w.args, "--db="+h.opts.Database)
			if h.opts.Unguarded {
				w.args = append(w.args, "--db-unguarded")
			}
		}
		if err := w.start(); err != nil {
			return err
		}
		h.workers = append(h.workers, w)
		h.kubelet.probe(pod, "http://"+readyAddr+"/readyz")
	}
	for _, l := range Leases {
		if err := h.cl.Create(ctx, l.DeepCopy()); err != nil {
			return err
		}
	}
	ranges := []*fencerv1.IDRange{
		{ObjectMeta: metav1.ObjectMeta{Name: "ids", Namespace: Namespace},
			Spec: fencerv1.IDRangeSpec{Mode: fencerv1.ModeBlocks, Min: 0, Max: 1 << 62, BlockSize: ptr.To[int64](1000),
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "worker"}}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "slots", Namespace: Namespace},
			Spec: fencerv1.IDRangeSpec{Mode: fencerv1.ModeSlots, Min: 0, Max: 7, SlotTTLSeconds: ptr.To[int32](3),
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "worker"}}}},
	}
	for _, r := range ranges {
		if err := h.cl.Create(ctx, r); err != nil {
			return err
		}
	}
	return nil
}

// workerRBAC gives the workers' service account what a careless operator
// might: ConfigMaps, their own pods, and Leases with their status. Only the
// status guard (a ValidatingAdmissionPolicy) stands between a worker and a
// forged Lease status.
func (h *Harness) workerRBAC(ctx context.Context) error {
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "worker", Namespace: Namespace}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "create", "update", "patch", "delete"}},
		// The hostile writes' fenced Deployment: RBAC lets them through, so
		// only the webhook refuses them.
		{APIGroups: []string{"apps"}, Resources: []string{"deployments", "deployments/scale", "deployments/status"}, Verbs: []string{"get", "create", "update", "patch", "delete"}},
		// get and list: the worker reads its own and other pods'
		// annotations (the hostile copies); patch: it relabels its own pod.
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "patch"}},
		{APIGroups: []string{"fencer.io"}, Resources: []string{"leases", "leases/status"}, Verbs: []string{"get", "list", "update", "patch"}},
	}}
	objs := []client.Object{
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "worker", Namespace: Namespace}},
		role,
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "worker", Namespace: Namespace},
			RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "worker"},
			Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "worker", Namespace: Namespace}}},
	}
	for _, o := range objs {
		if err := h.cl.Create(ctx, o); err != nil {
			return err
		}
	}
	return nil
}

// Heal ends every fault: processes resumed and running, links passing,
// etcd members up.
func (h *Harness) Heal(ctx context.Context) error {
	h.webhook.Set(faultproxy.Pass)
	for _, p := range append(append([]*process{}, h.managers...), h.workers...) {
		p.resume()
		p.partition(faultproxy.Pass)
		for _, px := range p.proxies {
			px.SetDelay(0)
		}
		if !p.running() {
			if err := p.start(); err != nil {
				return err
			}
		}
	}
	var down []*devcluster.Etcd
	for _, m := range h.members {
		if !m.Running() {
			down = append(down, m)
		}
	}
	if len(down) > 0 {
		return devcluster.StartAll(ctx, down)
	}
	return nil
}

// Close stops everything and closes the history files.
func (h *Harness) Close() {
	if h.supervise != nil {
		h.supervise()
	}
	if h.kubelet != nil {
		h.kubelet.stop()
	}
	for _, p := range append(append([]*process{}, h.workers...), h.managers...) {
		p.stop(5 * time.Second)
		for _, px := range p.proxies {
			px.Close()
		}
	}
	h.stopWatches()
	if h.etcd != nil {
		h.etcd.Close()
	}
	for _, m := range h.members {
		_ = m.Stop()
	}
	if h.webhook != nil {
		h.webhook.Close()
	}
	if h.db != nil {
		_ = h.db.Close()
	}
	if h.env != nil {
		_ = h.env.Stop()
	}
	for _, w := range []*history.Writer{h.objects, h.leases, h.faults} {
		if w != nil {
			w.Close()
		}
	}
}

// StopWorkload stops the workers (SIGTERM: they flush their last IDs), then
// the history watches, once they have delivered the newest versions.
func (h *Harness) StopWorkload() error {
	for _, w := range h.workers {
		w.stop(10 * time.Second)
	}
	caught := h.caughtUp(context.Background())
	h.stopWatches()
	if caught != nil {
		return caught
	}
	select {
	case err := <-h.watchErr:
		return fmt.Errorf("a history watch failed, so the history is incomplete: %w", err)
	default:
		return nil
	}
}

// DumpEtcd writes etcd's whole history, from revision 1, to etcd.jsonl.
func (h *Harness) DumpEtcd(ctx context.Context) error {
	w, err := history.Create(filepath.Join(h.opts.Dir, "etcd.jsonl"))
	if err != nil {
		return err
	}
	defer w.Close()
	head, err := h.etcd.Get(ctx, "/", clientv3.WithCountOnly())
	if err != nil {
		return err
	}
	end := head.Header.Revision
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for resp := range h.etcd.Watch(wctx, "\x00", clientv3.WithFromKey(), clientv3.WithRev(1)) {
		if err := resp.Err(); err != nil {
			return err
		}
		for _, ev := range resp.Events {
			e := history.EtcdEvent{Revision: ev.Kv.ModRevision, Type: ev.Type.String(), Key: string(ev.Kv.Key),
				CreateRevision: ev.Kv.CreateRevision, Version: ev.Kv.Version, Value: string(ev.Kv.Value)}
			if err := w.Add(e); err != nil {
				return err
			}
			if ev.Kv.ModRevision >= end {
				return nil
			}
		}
	}
	return errors.New("etcd's history ended before its last revision")
}

// ManagerLogs returns the managers' logs.
func (h *Harness) ManagerLogs() (string, error) {
	var b strings.Builder
	for _, m := range h.managers {
		raw, err := os.ReadFile(m.log)
		if err != nil {
			return "", err
		}
		b.Write(raw)
	}
	return b.String(), nil
}

// Client is an admin client of the apiserver.
func (h *Harness) Client() client.Client { return h.cl }

// EtcdClient is a direct client of fencer's etcd (no proxy).
func (h *Harness) EtcdClient() *clientv3.Client { return h.etcd }

// Config is the admin rest config.
func (h *Harness) Config() *rest.Config { return h.cfg }

// Prefix is fencer's etcd prefix.
func (h *Harness) Prefix() string { return etcdkeys.DefaultPrefix }
