package devcluster

import (
	"bytes"
	"context"
	"crypto/x509/pkix"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/fencer-io/fencer/internal/identity"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
	"github.com/fencer-io/fencer/test/support/manifest"
)

// Kubectl runs the cluster's kubectl against it and returns its stdout.
func (c *Cluster) Kubectl(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, c.bin("kubectl"), append([]string{"--kubeconfig=" + c.Kubeconfig}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("kubectl %v: %w: %s", args, err, stderr.String())
	}
	return stdout.String(), nil
}

// InstallCRDs applies fencer's CRDs with kubectl and waits until the
// apiserver serves them.
func (c *Cluster) InstallCRDs(ctx context.Context, crdDir string) error {
	if _, err := c.Kubectl(ctx, "apply", "--server-side", "-f", crdDir); err != nil {
		return err
	}
	_, err := c.Kubectl(ctx, "wait", "--for=condition=Established", "--timeout=60s",
		"crd/leases.fencer.io", "crd/idranges.fencer.io")
	return err
}

// ManagerNamespace holds the manager's leader-election Lease in the dev cluster.
const ManagerNamespace = "fencer-system"

// StartManager runs the fencer manager binary against the cluster and waits
// until its readiness probe passes, which means it reaches etcd.
func (c *Cluster) StartManager(ctx context.Context, bin string, extraArgs ...string) error {
	bin, err := filepath.Abs(bin)
	if err != nil {
		return err
	}
	if _, err := c.Kubectl(ctx, "create", "namespace", ManagerNamespace); err != nil {
		return err
	}
	if err := c.installMetricsReader(ctx); err != nil {
		return err
	}
	if err := c.startFencerEtcd(ctx); err != nil {
		return fmt.Errorf("fencer's etcd: %w", err)
	}
	ports, err := FreePorts(3)
	if err != nil {
		return err
	}
	certDir, err := c.webhookCerts()
	if err != nil {
		return err
	}
	args := append([]string{
		"--kubeconfig=" + c.Kubeconfig,
		"--etcd-endpoints=" + c.FencerEtcd.Endpoint,
		"--etcd-workload-endpoints=" + c.workloadEndpoint(),
		"--etcd-pki-secret=" + etcdPKISecret,
		"--etcd-enable-auth",
		"--etcd-viewer-secret=fencer-etcd-viewer",
		// Keyed locks alone need the namespace's identity: the
		// directory-moves story has no Lease.
		"--identity-namespaces=default",
		"--webhook-namespace=" + ManagerNamespace,
		"--metrics-bind-address=127.0.0.1:" + strconv.Itoa(ports[0]),
		"--health-probe-bind-address=127.0.0.1:" + strconv.Itoa(ports[1]),
		"--leader-election-namespace=" + ManagerNamespace,
		"--webhook-host=127.0.0.1",
		"--webhook-port=" + strconv.Itoa(ports[2]),
		"--webhook-cert-dir=" + certDir,
	}, extraArgs...)
	p, err := startProc(c.opts.Dir, "fencer", bin, args...)
	if err != nil {
		return err
	}
	c.procs = append(c.procs, p)
	c.MetricsURL = fmt.Sprintf("https://127.0.0.1:%d/metrics", ports[0])
	c.WebhookURL = fmt.Sprintf("https://127.0.0.1:%d", ports[2])
	return waitHTTP(ctx, p, http.DefaultClient, fmt.Sprintf("http://127.0.0.1:%d/readyz", ports[1]), 60*time.Second)
}

// MetricsReader is the ServiceAccount, in ManagerNamespace, that may read
// the manager's metrics, as the chart's metrics-reader ClusterRole allows:
// `kubectl create token` gives a bearer token to scrape with.
const MetricsReader = "fencer-metrics-reader"

// installMetricsReader creates MetricsReader and binds it to a ClusterRole
// of the chart's name that grants GET /metrics.
func (c *Cluster) installMetricsReader(ctx context.Context) error {
	manifest := fmt.Sprintf(`apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: %[1]s}
rules:
- nonResourceURLs: [/metrics]
  verbs: [get]
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: %[1]s, namespace: %[2]s}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: %[1]s}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: %[1]s}
subjects:
- {kind: ServiceAccount, name: %[1]s, namespace: %[2]s}
`, MetricsReader, ManagerNamespace)
	path := c.Path("metrics-reader.yaml")
	if err := os.WriteFile(path, []byte(manifest), 0o644); err != nil {
		return err
	}
	_, err := c.Kubectl(ctx, "apply", "-f", path)
	return err
}

// webhookCerts issues the manager's webhook serving certificate for
// 127.0.0.1 from the dev CA, as tls.crt and tls.key.
func (c *Cluster) webhookCerts() (string, error) {
	if err := c.pki.issue("webhook", pkix.Name{CommonName: "fencer-webhook"}, true, []string{"localhost"}, []net.IP{net.ParseIP("127.0.0.1")}); err != nil {
		return "", err
	}
	dir := c.Path("webhook-certs")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	for from, to := range map[string]string{"webhook.crt": "tls.crt", "webhook.key": "tls.key"} {
		raw, err := os.ReadFile(c.pki.path(from))
		if err != nil {
			return "", err
		}
		if err := os.WriteFile(filepath.Join(dir, to), raw, 0o600); err != nil {
			return "", err
		}
	}
	return dir, nil
}

// InstallPolicies applies the chart's admission policies (guard, the file
// manifest.PoliciesFile names) with kubectl, naming as the manager the
// identity the manager runs as here: the cluster's kubeconfig user.
func (c *Cluster) InstallPolicies(ctx context.Context, guard string) error {
	user, err := c.Kubectl(ctx, "auth", "whoami", "-o", "jsonpath={.status.userInfo.username}")
	if err != nil {
		return err
	}
	objs, err := manifest.Policies(guard, strings.TrimSpace(user))
	if err != nil {
		return err
	}
	var out []byte
	for _, obj := range objs {
		b, err := yaml.Marshal(obj.Object)
		if err != nil {
			return err
		}
		out = append(append(out, b...), "---\n"...)
	}
	path := c.Path("policies.yaml")
	if err := os.WriteFile(path, out, 0o644); err != nil {
		return err
	}
	_, err = c.Kubectl(ctx, "apply", "-f", path)
	return err
}

// InstallWebhook applies the webhook configurations in manifest (a
// MutatingWebhookConfiguration and a ValidatingWebhookConfiguration) with
// kubectl, pointed at the manager started by StartManager on loopback.
func (c *Cluster) InstallWebhook(ctx context.Context, manifest string) error {
	raw, err := os.ReadFile(manifest)
	if err != nil {
		return err
	}
	ca, err := os.ReadFile(c.pki.path("ca.crt"))
	if err != nil {
		return err
	}
	var out []byte
	for _, doc := range bytes.Split(raw, []byte("\n---\n")) {
		b, err := c.pointAtManager(doc, ca)
		if err != nil {
			return fmt.Errorf("%s: %w", manifest, err)
		}
		out = append(append(out, b...), "---\n"...)
	}
	path := c.Path("webhook.yaml")
	if err := os.WriteFile(path, out, 0o644); err != nil {
		return err
	}
	_, err = c.Kubectl(ctx, "apply", "-f", path)
	return err
}

// pointAtManager rewrites one webhook configuration's clients (mutating or
// validating: both list webhooks with a clientConfig) to the manager's URL,
// keeping each webhook's path.
func (c *Cluster) pointAtManager(doc, ca []byte) ([]byte, error) {
	var cfg map[string]any
	if err := yaml.Unmarshal(doc, &cfg); err != nil {
		return nil, err
	}
	if k := cfg["kind"]; k != "MutatingWebhookConfiguration" && k != "ValidatingWebhookConfiguration" {
		return nil, fmt.Errorf("unexpected kind %v in a webhook manifest", k)
	}
	webhooks, _ := cfg["webhooks"].([]any)
	for _, w := range webhooks {
		wh, _ := w.(map[string]any)
		cc, _ := wh["clientConfig"].(map[string]any)
		svc, _ := cc["service"].(map[string]any)
		path, ok := svc["path"].(string)
		if !ok {
			path = "/"
		}
		wh["clientConfig"] = map[string]any{"url": c.WebhookURL + path, "caBundle": ca}
	}
	return yaml.Marshal(cfg)
}

// etcdPKISecret holds the CA of fencer's etcd in ManagerNamespace, as the
// chart's manager keeps it: the manager issues its own identity and the
// namespaces' from it.
const etcdPKISecret = "fencer-etcd-pki"

// startFencerEtcd starts fencer's etcd with TLS and auth on, and hands its
// CA to the manager in the etcdPKISecret Secret.
func (c *Cluster) startFencerEtcd(ctx context.Context) error {
	pki, err := NewEtcdPKI(c.Path("etcd-pki"), etcdkeys.DefaultPrefix)
	if err != nil {
		return err
	}
	// etcdctl's identity: root, the superuser EnableAuth creates.
	if err := pki.Issue("root", identity.Request{CommonName: "root"}); err != nil {
		return err
	}
	e, err := NewEtcd(c.opts.BinDir, c.opts.Dir, "fencer-etcd")
	if err != nil {
		return err
	}
	e.Secure(pki)
	if c.real != nil {
		e.ExtraClientURLs = []string{onBridge(e.Endpoint)}
	}
	err = e.Start(ctx)
	if e.proc != nil {
		c.procs = append(c.procs, e.proc)
	}
	if err != nil {
		return err
	}
	c.FencerEtcd, c.FencerEtcdPKI = e, pki
	keyPEM, err := pki.CA.KeyPEM()
	if err != nil {
		return err
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: etcdPKISecret, Namespace: ManagerNamespace},
		Data:       map[string][]byte{"ca.crt": pki.CA.CertPEM, "ca.key": keyPEM},
	}
	_, err = c.Client.CoreV1().Secrets(ManagerNamespace).Create(ctx, secret, metav1.CreateOptions{})
	return err
}

// WriteEndpoints writes <dir>/etcdctl.env, which points etcdctl at
// fencer's etcd as root (`. bin/dev/etcdctl.env`), and the bare endpoint
// in <dir>/etcd-endpoints.
func (c *Cluster) WriteEndpoints() error {
	p := c.FencerEtcdPKI
	env := fmt.Sprintf("export ETCDCTL_ENDPOINTS=%s\nexport ETCDCTL_CACERT=%s\nexport ETCDCTL_CERT=%s\nexport ETCDCTL_KEY=%s\n",
		c.FencerEtcd.Endpoint, p.Path("ca.crt"), p.Path("root.crt"), p.Path("root.key"))
	if err := os.WriteFile(c.Path("etcdctl.env"), []byte(env), 0o644); err != nil {
		return err
	}
	return os.WriteFile(c.Path("etcd-endpoints"), []byte(c.FencerEtcd.Endpoint+"\n"), 0o644)
}

// onBridge is an https endpoint's URL on the real node's bridge address,
// where its pods reach it: the same port.
func onBridge(endpoint string) string {
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(endpoint, "https://"))
	return "https://" + net.JoinHostPort(realBridgeIP, port)
}

// workloadEndpoint is the etcd URL the namespaces' credentials name: one
// that pods on the real node reach too, when there is one.
func (c *Cluster) workloadEndpoint() string {
	if c.real != nil {
		return onBridge(c.FencerEtcd.Endpoint)
	}
	return c.FencerEtcd.Endpoint
}
