// Command dev brings up fencer's local cluster (`make dev`): etcd, the
// Kubernetes control plane, kwok nodes, fencer's CRDs and the fencer manager,
// all on loopback. It runs until SIGINT or SIGTERM, then stops every process
// it started.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/fencer-io/fencer/test/support/devcluster"
)

func main() {
	var (
		dir     = flag.String("dir", "bin/dev", "State directory: kubeconfig, etcd-endpoints, certificates, data and logs/. Wiped on start.")
		binDir  = flag.String("bin", "bin", "Directory holding etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl and kwok (built by `make tools`).")
		manager = flag.String("manager", "bin/fencer", "The fencer manager binary (built by `make build`).")
		crds    = flag.String("crds", "config/crd/bases", "Directory of fencer's CRD manifests.")
		webhook = flag.String("webhook", "config/webhook/manifests.yaml", "fencer's ValidatingWebhookConfiguration; dev points it at the manager on loopback.")
		guard   = flag.String("guard", "config/guard/policies.yaml", "fencer's admission policies (the status guard and the ignored-label warning); dev names its manager's identity in them.")
		tools   = flag.String("tools", "hack/tools", "The tools module; kwok's stages are read from the kwok version it pins.")
		nodes   = flag.Int("nodes", 3, "How many kwok nodes to create.")
		real    = flag.Bool("real-node", false, "Also run a real node: a kubelet with containerd, runc and CNI on this machine (root; installs the Debian packages if missing; docs/development.md).")
	)
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *dir, *binDir, *manager, *crds, *webhook, *guard, *tools, *nodes, *real); err != nil {
		fmt.Fprintf(os.Stderr, "dev: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, dir, binDir, manager, crds, webhook, guard, tools string, nodes int, real bool) error {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	stages, err := devcluster.KwokStages(ctx, tools)
	if err != nil {
		return err
	}
	c, err := devcluster.Start(ctx, devcluster.Options{
		BinDir: binDir, Dir: dir, Nodes: nodes, KwokStages: stages, Log: os.Stdout, RealNode: real,
	})
	if err != nil {
		return err
	}
	defer func() {
		fmt.Println("[dev] stopping every process")
		if err := c.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "dev: stopping: %v\n", err)
		}
	}()
	fmt.Println("[dev] installing CRDs with kubectl")
	if err := c.InstallCRDs(ctx, crds); err != nil {
		return err
	}
	fmt.Println("[dev] starting the fencer manager")
	if err := c.StartManager(ctx, manager); err != nil {
		return err
	}
	fmt.Println("[dev] installing the fencing webhook with kubectl")
	if err := c.InstallWebhook(ctx, webhook); err != nil {
		return err
	}
	if err := c.InstallPolicies(ctx, guard); err != nil {
		return err
	}
	if err := c.WriteEndpoints(); err != nil {
		return err
	}
	printReady(c, binDir)
	return c.Wait(ctx)
}

func printReady(c *devcluster.Cluster, binDir string) {
	kc, _ := filepath.Rel(mustWd(), c.Kubeconfig)
	fmt.Println("fencer dev environment ready")
	fmt.Printf(`
  export KUBECONFIG=%[1]s
  %[2]s/kubectl get nodes
  %[2]s/kubectl apply -f examples/
  %[2]s/kubectl get flease,idr
  . %[3]s && %[2]s/etcdctl get --prefix /fencer

  Logs: %[4]s
  Metrics: %[5]s
    curl -k -H "Authorization: Bearer $(%[2]s/kubectl create token %[6]s -n %[7]s)" %[5]s
  Press Ctrl-C to stop everything.
`, kc, binDir, c.Path("etcdctl.env"), c.Path("logs"), c.MetricsURL, devcluster.MetricsReader, devcluster.ManagerNamespace)
}

func mustWd() string {
	wd, err := os.Getwd()
	if err != nil {
		return "/"
	}
	return wd
}
