// Package devcluster runs a local Kubernetes cluster where pods live, with no
// container runtime: etcd, kube-apiserver, kube-controller-manager and
// kube-scheduler built from their Go modules, and kwok simulating the nodes so
// that pods are scheduled, become Ready and are deleted as in a real cluster.
// `make dev` and the smoke and e2e tests use it.
package devcluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Options configure a dev cluster.
type Options struct {
	// BinDir holds etcd, kube-apiserver, kube-controller-manager,
	// kube-scheduler, kubectl and kwok.
	BinDir string
	// Dir is the state directory: certificates, data, logs, kubeconfig.
	// It is wiped on start.
	Dir string
	// Nodes is how many kwok nodes to create.
	Nodes int
	// KwokStages are the kwok Stage files (node and pod lifecycles).
	KwokStages []string
	// Log receives progress lines.
	Log io.Writer
	// RealNode adds a real node next to the kwok nodes: a kubelet with
	// containerd, runc and CNI on this machine (root only; realnode.go).
	RealNode bool
}

// Cluster is a running dev cluster.
type Cluster struct {
	opts  Options
	procs []*proc
	pki   *pki
	// server is the apiserver's URL; real the real node, if any.
	server string
	real   *realNode

	// Kubeconfig is the path of an admin kubeconfig.
	Kubeconfig string
	// EtcdEndpoint is the client URL of the Kubernetes etcd (plain, on loopback).
	EtcdEndpoint string
	// FencerEtcd is fencer's own etcd, locked down as the chart runs it:
	// TLS, client certificates, auth on. StartManager starts it.
	FencerEtcd *Etcd
	// FencerEtcdPKI holds its CA and certificates; root.crt is etcdctl's.
	FencerEtcdPKI *EtcdPKI
	// Client is an admin clientset.
	Client kubernetes.Interface
	// MetricsURL is the manager's metrics endpoint, once StartManager ran.
	MetricsURL string
	// WebhookURL is the manager's webhook server, once StartManager ran.
	WebhookURL string
}

// The kwok annotation that marks a node as simulated.
const kwokNodeAnnotation = "kwok.x-k8s.io/node"

// Start brings the cluster up and returns when nodes are Ready and the
// default service account exists, so pods can be created at once. On error,
// everything already started is stopped.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	if opts.Nodes <= 0 {
		opts.Nodes = 3
	}
	if opts.Log == nil {
		opts.Log = io.Discard
	}
	// Children run in Dir, so relative paths would resolve against it.
	var err error
	if opts.BinDir, err = filepath.Abs(opts.BinDir); err != nil {
		return nil, err
	}
	if opts.Dir, err = filepath.Abs(opts.Dir); err != nil {
		return nil, err
	}
	if err := os.RemoveAll(opts.Dir); err != nil {
		return nil, err
	}
	c := &Cluster{opts: opts}
	if err := c.start(ctx); err != nil {
		_ = c.Stop()
		return nil, err
	}
	return c, nil
}

func (c *Cluster) start(ctx context.Context) error {
	var err error
	if c.pki, err = c.makePKI(); err != nil {
		return fmt.Errorf("certificates: %w", err)
	}
	for _, step := range []struct {
		name string
		fn   func(context.Context) error
	}{
		{"etcd", c.startEtcd},
		{"kube-apiserver", c.startAPIServer},
		{"controllers, scheduler and kwok", c.startControllers},
		{"nodes", c.createNodes},
		{"default service account", c.waitServiceAccount},
	} {
		if step.name == "default service account" && c.opts.RealNode {
			c.logf("starting the real node")
			if err := c.startRealNode(ctx); err != nil {
				return err
			}
		}
		c.logf("starting %s", step.name)
		if err := step.fn(ctx); err != nil {
			return fmt.Errorf("%s: %w", step.name, err)
		}
	}
	return nil
}

func (c *Cluster) logf(format string, args ...any) {
	fmt.Fprintf(c.opts.Log, "[dev %s] %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

func (c *Cluster) bin(name string) string { return filepath.Join(c.opts.BinDir, name) }

// Path names a file in the cluster's state directory.
func (c *Cluster) Path(elem ...string) string {
	return filepath.Join(append([]string{c.opts.Dir}, elem...)...)
}

func (c *Cluster) makePKI() (*pki, error) {
	p, err := newPKI(c.Path("pki"))
	if err != nil {
		return nil, err
	}
	loopback := []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP(kubernetesServiceIP), net.ParseIP(realBridgeIP)}
	names := []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}
	if err := p.issue("apiserver", pkix.Name{CommonName: "kube-apiserver"}, true, names, loopback); err != nil {
		return nil, err
	}
	admin := pkix.Name{CommonName: "fencer-dev-admin", Organization: []string{"system:masters"}}
	if err := p.issue("admin", admin, false, nil, nil); err != nil {
		return nil, err
	}
	// The apiserver's identity towards kubelets (logs, exec).
	kubeletClient := pkix.Name{CommonName: "kube-apiserver-kubelet-client", Organization: []string{"system:masters"}}
	if err := p.issue("apiserver-kubelet-client", kubeletClient, false, nil, nil); err != nil {
		return nil, err
	}
	return p, p.serviceAccountKeys()
}

func (c *Cluster) run(name string, args ...string) (*proc, error) {
	p, err := startProc(c.opts.Dir, name, c.bin(name), args...)
	if err != nil {
		return nil, err
	}
	c.procs = append(c.procs, p)
	return p, nil
}

func (c *Cluster) startEtcd(ctx context.Context) error {
	e, err := NewEtcd(c.opts.BinDir, c.opts.Dir, "etcd")
	if err != nil {
		return err
	}
	err = e.Start(ctx)
	if e.proc != nil {
		c.procs = append(c.procs, e.proc)
	}
	c.EtcdEndpoint = e.Endpoint
	return err
}

func (c *Cluster) startAPIServer(ctx context.Context) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	server := fmt.Sprintf("https://127.0.0.1:%d", port)
	c.server = server
	// Without a real node nothing routes to the kubernetes Service, and the
	// endpoint reconciler refuses a loopback address. With one, kube-proxy
	// routes the Service to the bridge address, where pods reach it.
	network := []string{"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--endpoint-reconciler-type=none"}
	if c.opts.RealNode {
		network = []string{"--bind-address=0.0.0.0", "--advertise-address=" + realBridgeIP}
	}
	p, err := c.run("kube-apiserver", append(network,
		"--etcd-servers="+c.EtcdEndpoint,
		"--kubelet-preferred-address-types=InternalIP,Hostname",
		"--kubelet-client-certificate="+c.pki.path("apiserver-kubelet-client.crt"),
		"--kubelet-client-key="+c.pki.path("apiserver-kubelet-client.key"),
		"--secure-port="+strconv.Itoa(port),
		"--tls-cert-file="+c.pki.path("apiserver.crt"),
		"--tls-private-key-file="+c.pki.path("apiserver.key"),
		"--client-ca-file="+c.pki.path("ca.crt"),
		"--service-account-key-file="+c.pki.path("sa.pub"),
		"--service-account-signing-key-file="+c.pki.path("sa.key"),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--api-audiences=https://kubernetes.default.svc.cluster.local",
		"--service-cluster-ip-range="+serviceSubnet,
		"--authorization-mode=Node,RBAC",
		"--allow-privileged=true",
		"--profiling=false",
	)...)
	if err != nil {
		return err
	}
	if err := c.writeKubeconfig(server); err != nil {
		return err
	}
	tlsCfg, err := c.adminTLS()
	if err != nil {
		return err
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsCfg}}
	if err := waitHTTP(ctx, p, hc, server+"/readyz", 90*time.Second); err != nil {
		return err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		return err
	}
	c.Client, err = kubernetes.NewForConfig(cfg)
	return err
}

func (c *Cluster) adminTLS() (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(c.pki.path("admin.crt"), c.pki.path("admin.key"))
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(c.pki.ca.Cert)
	return &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool}, nil
}

func (c *Cluster) writeKubeconfig(server string) error {
	c.Kubeconfig = c.Path("kubeconfig")
	return writeKubeconfig(c.Kubeconfig, server, c.pki.path("ca.crt"), c.pki.path("admin.crt"), c.pki.path("admin.key"))
}

// writeKubeconfig writes a kubeconfig for server with a client certificate.
func writeKubeconfig(path, server, ca, cert, key string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["fencer-dev"] = &clientcmdapi.Cluster{Server: server, CertificateAuthority: ca}
	cfg.AuthInfos["user"] = &clientcmdapi.AuthInfo{ClientCertificate: cert, ClientKey: key}
	cfg.Contexts["fencer-dev"] = &clientcmdapi.Context{Cluster: "fencer-dev", AuthInfo: "user", Namespace: "default"}
	cfg.CurrentContext = "fencer-dev"
	return clientcmd.WriteToFile(*cfg, path)
}

func (c *Cluster) startControllers(ctx context.Context) error {
	ports, err := FreePorts(3)
	if err != nil {
		return err
	}
	kc := "--kubeconfig=" + c.Kubeconfig
	if _, err := c.run("kube-controller-manager", kc,
		"--authentication-kubeconfig="+c.Kubeconfig,
		"--authorization-kubeconfig="+c.Kubeconfig,
		"--bind-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(ports[0]),
		"--leader-elect=false",
		"--root-ca-file="+c.pki.path("ca.crt"),
		"--service-account-private-key-file="+c.pki.path("sa.key"),
		"--use-service-account-credentials=true",
		"--cluster-signing-cert-file="+c.pki.path("ca.crt"),
		"--cluster-signing-key-file="+c.pki.path("ca.key"),
	); err != nil {
		return err
	}
	if _, err := c.run("kube-scheduler", kc,
		"--authentication-kubeconfig="+c.Kubeconfig,
		"--authorization-kubeconfig="+c.Kubeconfig,
		"--bind-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(ports[1]),
		"--leader-elect=false",
	); err != nil {
		return err
	}
	args := []string{kc,
		"--manage-all-nodes=false",
		"--manage-nodes-with-annotation-selector=" + kwokNodeAnnotation + "=fake",
		"--cidr=10.244.0.1/16",
		"--node-ip=127.0.0.1",
		"--server-address=127.0.0.1:" + strconv.Itoa(ports[2]),
		// The "fast" profile heartbeats through node Leases: without kwok
		// renewing them, kube-controller-manager marks the nodes, and then
		// every pod on them, not Ready after its 50 s grace period.
		"--node-lease-duration-seconds=40",
	}
	stages, err := keepRunningStages(c.opts.KwokStages, c.Path("kwok-stages"))
	if err != nil {
		return err
	}
	for _, s := range stages {
		args = append(args, "--config="+s)
	}
	_, err = c.run("kwok", args...)
	return err
}

func (c *Cluster) createNodes(ctx context.Context) error {
	for i := range c.opts.Nodes {
		if err := c.checkAlive(); err != nil {
			return err
		}
		if _, err := c.Client.CoreV1().Nodes().Create(ctx, kwokNode(fmt.Sprintf("kwok-node-%d", i)), metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	return c.poll(ctx, 60*time.Second, "nodes Ready", func() (bool, error) {
		nodes, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		ready := 0
		for _, n := range nodes.Items {
			if nodeReady(&n) {
				ready++
			}
		}
		return ready == c.opts.Nodes, nil
	})
}

func kwokNode(name string) *corev1.Node {
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("32"),
		corev1.ResourceMemory: resource.MustParse("256Gi"),
		corev1.ResourcePods:   resource.MustParse("110"),
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Annotations: map[string]string{kwokNodeAnnotation: "fake"},
			Labels: map[string]string{
				"type":                   "kwok",
				"kubernetes.io/hostname": name,
				"kubernetes.io/os":       "linux",
				"kubernetes.io/arch":     "amd64",
			},
		},
		Status: corev1.NodeStatus{Capacity: capacity, Allocatable: capacity},
	}
}

func nodeReady(n *corev1.Node) bool {
	for _, cond := range n.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

// waitServiceAccount waits for kube-controller-manager to create the default
// service account; until then the ServiceAccount admission plugin refuses pods.
func (c *Cluster) waitServiceAccount(ctx context.Context) error {
	return c.poll(ctx, 60*time.Second, "default service account", func() (bool, error) {
		_, err := c.Client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	})
}

// Pids lists the process IDs of every process the cluster started.
func (c *Cluster) Pids() []int {
	pids := make([]int, len(c.procs))
	for i, p := range c.procs {
		pids[i] = p.cmd.Process.Pid
	}
	return pids
}

// checkAlive reports the first process that has exited.
func (c *Cluster) checkAlive() error {
	for _, p := range c.procs {
		if err := p.exited(); err != nil {
			return err
		}
	}
	return nil
}

// Wait blocks until ctx ends or a process of the cluster exits.
func (c *Cluster) Wait(ctx context.Context) error {
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			if err := c.checkAlive(); err != nil {
				return err
			}
		}
	}
}

// Stop stops every process, last started first, and waits for each to exit.
// A real node is torn down first, back to the machine's previous state.
func (c *Cluster) Stop() error {
	var errs []error
	if c.real != nil {
		errs = append(errs, c.real.stop())
		c.real = nil
	}
	for i := len(c.procs) - 1; i >= 0; i-- {
		errs = append(errs, c.procs[i].stop(10*time.Second))
	}
	c.procs = nil
	return errors.Join(errs...)
}

func (c *Cluster) poll(ctx context.Context, timeout time.Duration, what string, done func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, err := done()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		if err := c.checkAlive(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s waiting for %s; logs are in %s", timeout, what, c.Path("logs"))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// waitHTTP polls url until it answers 200, p exits, or timeout passes.
func waitHTTP(ctx context.Context, p *proc, hc *http.Client, url string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		if err := p.exited(); err != nil {
			return err
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := hc.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Errorf("%s answered %s", url, resp.Status)
		} else {
			last = err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s not healthy after %s (last: %w); see %s", p.name, timeout, last, p.log)
}
