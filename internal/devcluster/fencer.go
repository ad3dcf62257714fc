package devcluster

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"
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
	ports, err := freePorts(2)
	if err != nil {
		return err
	}
	args := append([]string{
		"--kubeconfig=" + c.Kubeconfig,
		"--etcd-endpoints=" + c.EtcdEndpoint,
		"--metrics-bind-address=127.0.0.1:" + strconv.Itoa(ports[0]),
		"--health-probe-bind-address=127.0.0.1:" + strconv.Itoa(ports[1]),
		"--leader-election-namespace=" + ManagerNamespace,
	}, extraArgs...)
	p, err := startProc(c.opts.Dir, "fencer", bin, args...)
	if err != nil {
		return err
	}
	c.procs = append(c.procs, p)
	c.MetricsURL = fmt.Sprintf("http://127.0.0.1:%d/metrics", ports[0])
	return waitHTTP(ctx, p, http.DefaultClient, fmt.Sprintf("http://127.0.0.1:%d/readyz", ports[1]), 60*time.Second)
}

// WriteEndpoints records the etcd endpoint in <dir>/etcd-endpoints for
// etcdctl and the SDK.
func (c *Cluster) WriteEndpoints() error {
	return os.WriteFile(c.Path("etcd-endpoints"), []byte(c.EtcdEndpoint+"\n"), 0o644)
}
