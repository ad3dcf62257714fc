package devcluster

import (
	"context"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fencer-io/fencer/test/support/debian"
)

// The real node's network: a bridge this package creates, with no route
// out and no masquerade, so pod traffic never leaves the machine.
const (
	RealNodeName = "real-node"
	realBridge   = "fencer0"
	realBridgeIP = "10.88.0.1"
	// realBridgeMAC is set on the bridge when it is created. A bridge with
	// no address of its own takes the lowest of its ports', so a pod
	// starting or stopping could change it under the other pods, whose ARP
	// entries for the gateway then point at a MAC nobody answers: their
	// packets to the node are dropped for seconds, until the entries
	// expire. This is a locally administered address.
	realBridgeMAC  = "02:66:65:6e:63:72"
	realPodSubnet  = "10.88.0.0/24"
	realPauseImage = "registry.k8s.io/pause:3.10"
)

// realNodePackages are the Debian packages the real node runs on, with a
// file each that shows it is installed.
var realNodePackages = map[string]string{
	"containerd":                  "/usr/bin/containerd",
	"runc":                        "/usr/sbin/runc",
	"containernetworking-plugins": "/usr/lib/cni/bridge",
	"iptables":                    "/usr/sbin/iptables",
}

// KernelSettings are the sysctls the kubelet, kube-proxy and the CNI bridge
// plugin may change; teardown puts back what they were. Those this kernel
// lacks are skipped.
var KernelSettings = []string{
	"vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops",
	"net/ipv4/ip_forward", "net/ipv4/conf/all/route_localnet",
	"net/bridge/bridge-nf-call-iptables", "net/netfilter/nf_conntrack_max",
}

// realNode is a kubelet with containerd, runc and the CNI bridge plugin on
// this machine, joined to the dev cluster next to the kwok nodes.
type realNode struct {
	c      *Cluster
	dir    string
	sock   string
	procs  []*proc
	undo   []func() error // teardown steps, run last first
	sysctl map[string]string
	// netnsBefore are the network namespaces that existed before: teardown
	// removes only the pods' own.
	netnsBefore map[string]bool
}

// RealNodeDir is where the real node keeps its state: below the cluster's
// directory, so nothing of it outlives a run but what teardown removes.
func (c *Cluster) RealNodeDir() string { return c.Path("real-node") }

// startRealNode brings the real node up and waits until it is Ready.
func (c *Cluster) startRealNode(ctx context.Context) error {
	if os.Geteuid() != 0 {
		return errors.New("the real node needs root: containerd, runc, a network bridge and cgroups")
	}
	n := &realNode{c: c, dir: c.RealNodeDir(), netnsBefore: map[string]bool{}}
	c.real = n
	if entries, err := os.ReadDir("/var/run/netns"); err == nil {
		for _, e := range entries {
			n.netnsBefore[e.Name()] = true
		}
	} else {
		n.undo = append(n.undo, func() error { return os.RemoveAll("/var/run/netns") })
	}
	n.sock = filepath.Join(n.dir, "containerd", "containerd.sock")
	if err := os.MkdirAll(n.dir, 0o755); err != nil {
		return err
	}
	for _, step := range []struct {
		name string
		fn   func(context.Context) error
	}{
		{"Debian packages", n.ensurePackages},
		{"saving iptables rules and kernel settings", n.saveMachineState},
		{"bridge " + realBridge, n.bridge},
		{"CoreDNS", n.clusterDNS},
		{"containerd", n.containerd},
		{"pause image", n.pauseImage},
		{"kubelet", n.kubelet},
		// After the kubelet: kube-proxy waits for its Node to exist.
		{"kube-proxy", n.kubeProxy},
	} {
		c.logf("real node: %s", step.name)
		if err := step.fn(ctx); err != nil {
			return fmt.Errorf("real node: %s: %w", step.name, err)
		}
	}
	return c.poll(ctx, 2*time.Minute, "the real node Ready", func() (bool, error) {
		nodes, err := c.Client.CoreV1().Nodes().Get(ctx, RealNodeName, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		return nodeReady(nodes), nil
	})
}

func (n *realNode) ensurePackages(ctx context.Context) error {
	missing := debian.Missing(realNodePackages)
	if len(missing) == 0 {
		return nil
	}
	n.c.logf("real node: apt-get install %s", strings.Join(missing, " "))
	return debian.Install(ctx, missing...)
}

func (n *realNode) containerd(ctx context.Context) error {
	dir := filepath.Join(n.dir, "containerd")
	if err := os.MkdirAll(filepath.Join(n.dir, "cni"), 0o755); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	// Pods get one route besides their subnet: the Service range, through
	// the node, where kube-proxy translates it. Nothing else is reachable.
	cni := fmt.Sprintf(`{"cniVersion": "0.4.0", "name": "fencer-real-node", "plugins": [
  {"type": "bridge", "bridge": %q, "isGateway": true, "ipMasq": false,
   "ipam": {"type": "host-local", "subnet": %q, "gateway": %q, "dataDir": %q,
            "routes": [{"dst": %q}]}},
  {"type": "loopback"}]}`, realBridge, realPodSubnet, realBridgeIP, filepath.Join(n.dir, "cni-ipam"), serviceSubnet)
	if err := os.WriteFile(filepath.Join(n.dir, "cni", "10-fencer.conflist"), []byte(cni), 0o644); err != nil {
		return err
	}
	// restrict_oom_score_adj: this machine's root lacks CAP_SYS_RESOURCE,
	// and runc's nsexec fails to lower a container's oom_score_adj without
	// it ("can't get final child's PID from pipe: EOF").
	cfg := fmt.Sprintf(`version = 2
root = %q
state = %q
[grpc]
  address = %q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = %q
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      SystemdCgroup = false
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), n.sock, realPauseImage, filepath.Join(n.dir, "cni"))
	conf := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(conf, []byte(cfg), 0o644); err != nil {
		return err
	}
	p, err := startProc(n.c.opts.Dir, "containerd", "containerd", "--config", conf)
	if err != nil {
		return err
	}
	n.procs = append(n.procs, p)
	return n.c.poll(ctx, 30*time.Second, "containerd's socket", func() (bool, error) {
		if err := p.exited(); err != nil {
			return false, err
		}
		_, err := os.Stat(n.sock)
		return err == nil, nil
	})
}

// ImportImage loads an image tarball into the real node's containerd, as
// `ctr -n k8s.io images import` does.
func (c *Cluster) ImportImage(ctx context.Context, tarball string) error {
	if c.real == nil {
		return errors.New("no real node: start the cluster with RealNode")
	}
	return run(ctx, "ctr", "--address", c.real.sock, "-n", "k8s.io", "images", "import", tarball)
}

// pauseImage builds hack/pause into a one-layer image tagged as the
// sandbox image and imports it.
func (n *realNode) pauseImage(ctx context.Context) error {
	bin := filepath.Join(n.dir, "pause")
	root := filepath.Dir(n.c.opts.BinDir)
	build := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", bin, "./hack/pause")
	build.Dir, build.Env = root, append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("go build ./hack/pause: %w\n%s", err, out)
	}
	return n.c.BuildImage(ctx, bin, realPauseImage, "pause", "65535:65535")
}

// BuildImage writes binary into a one-layer image tagged tag (with
// hack/tools/image) and imports it into the real node.
func (c *Cluster) BuildImage(ctx context.Context, binary, tag, entry, user string) error {
	tarball := filepath.Join(c.RealNodeDir(), entry+"-image.tar")
	root := filepath.Dir(c.opts.BinDir)
	img := exec.CommandContext(ctx, "go", "run", ".", "--binary", binary, "--tag", tag, "--out", tarball, "--entrypoint", entry, "--user", user)
	img.Dir = filepath.Join(root, "hack", "tools", "image")
	if out, err := img.CombinedOutput(); err != nil {
		return fmt.Errorf("building image %s: %w\n%s", tag, err, out)
	}
	return c.ImportImage(ctx, tarball)
}

func (n *realNode) kubelet(ctx context.Context) error {
	p := n.c.pki
	node := pkix.Name{CommonName: "system:node:" + RealNodeName, Organization: []string{"system:nodes"}}
	if err := p.issue("kubelet-client", node, false, nil, nil); err != nil {
		return err
	}
	if err := p.issue("kubelet-serving", pkix.Name{CommonName: RealNodeName}, true, []string{RealNodeName}, []net.IP{net.ParseIP(realBridgeIP)}); err != nil {
		return err
	}
	kubeconfig := filepath.Join(n.dir, "kubelet.kubeconfig")
	if err := writeKubeconfig(kubeconfig, n.c.server, p.path("ca.crt"), p.path("kubelet-client.crt"), p.path("kubelet-client.key")); err != nil {
		return err
	}
	for _, d := range []string{"/var/log/pods", "/var/log/containers"} {
		if _, err := os.Stat(d); os.IsNotExist(err) {
			n.undo = append(n.undo, func() error { return os.RemoveAll(d) })
		}
	}
	cfg := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# cgroup v1 here: the kubelet refuses it unless told otherwise.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /
containerRuntimeEndpoint: unix://%s
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: %q}
authorization: {mode: AlwaysAllow}
tlsCertFile: %q
tlsPrivateKeyFile: %q
address: %s
failSwapOn: false
resolvConf: ""
clusterDNS: [%s]
clusterDomain: %s
podLogsDir: %q
# The kubelet's image GC and eviction would act on the whole machine's disk.
imageGCHighThresholdPercent: 100
evictionHard: {}
`, n.sock, p.path("ca.crt"), p.path("kubelet-serving.crt"), p.path("kubelet-serving.key"), realBridgeIP, realBridgeIP, clusterDomain, filepath.Join(n.dir, "pod-logs"))
	conf := filepath.Join(n.dir, "kubelet.yaml")
	if err := os.WriteFile(conf, []byte(cfg), 0o644); err != nil {
		return err
	}
	proc, err := startProc(n.c.opts.Dir, "kubelet", n.c.bin("kubelet"),
		"--config="+conf,
		"--kubeconfig="+kubeconfig,
		"--root-dir="+filepath.Join(n.dir, "kubelet"),
		"--hostname-override="+RealNodeName,
		"--node-ip="+realBridgeIP,
		"--v=1",
	)
	if err != nil {
		return err
	}
	n.procs = append(n.procs, proc)
	return nil
}

func (n *realNode) saveKernelSettings() error {
	n.sysctl = map[string]string{}
	for _, k := range KernelSettings {
		raw, err := os.ReadFile(filepath.Join("/proc/sys", k))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		n.sysctl[k] = strings.TrimSpace(string(raw))
	}
	n.undo = append(n.undo, func() error {
		var errs []error
		for k, v := range n.sysctl {
			errs = append(errs, os.WriteFile(filepath.Join("/proc/sys", k), []byte(v), 0o644))
		}
		return errors.Join(errs...)
	})
	return nil
}

// stop tears the node down to the machine's previous state: the kubelet,
// every container and shim, containerd, the mounts below the node's
// directory, the kubepods cgroups, the pods' network namespaces, the
// bridge, the kernel settings, and the log directories it created.
func (n *realNode) stop() error {
	var errs []error
	for i := len(n.procs) - 1; i >= 0; i-- {
		if n.procs[i].name == "containerd" {
			errs = append(errs, n.killShims())
		}
		errs = append(errs, n.procs[i].stop(10*time.Second))
	}
	errs = append(errs, unmountBelow(n.dir), removeCgroups("kubepods"), removeNetns(n.netnsBefore))
	for i := len(n.undo) - 1; i >= 0; i-- {
		errs = append(errs, n.undo[i]())
	}
	return errors.Join(errs...)
}

// killShims kills the containerd shims of this node's containerd (they
// outlive it by design) and with them every container.
func (n *realNode) killShims() error {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return err
	}
	for _, e := range entries {
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !strings.Contains(string(raw), "containerd-shim") || !strings.Contains(string(raw), n.sock) {
			continue
		}
		var pid int
		if _, err := fmt.Sscan(e.Name(), &pid); err == nil {
			// The shim's group holds the container's processes too.
			_ = syscall.Kill(-pid, syscall.SIGKILL)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	// runc's containers are in their own groups: anything still in a
	// kubepods cgroup is killed by removeCgroups.
	return nil
}

// unmountBelow unmounts every mount point below dir, deepest first.
func unmountBelow(dir string) error {
	raw, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	var points []string
	for _, line := range strings.Split(string(raw), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			points = append(points, f[4])
		}
	}
	var errs []error
	for i := len(points) - 1; i >= 0; i-- {
		if err := syscall.Unmount(points[i], syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
			errs = append(errs, fmt.Errorf("unmounting %s: %w", points[i], err))
		}
	}
	return errors.Join(errs...)
}

// removeCgroups kills what is left in, and removes, every cgroup named
// name (and below) in each cgroup v1 hierarchy.
func removeCgroups(name string) error {
	hierarchies, err := os.ReadDir("/sys/fs/cgroup")
	if err != nil {
		return err
	}
	var errs []error
	for _, h := range hierarchies {
		root := filepath.Join("/sys/fs/cgroup", h.Name(), name)
		if _, err := os.Stat(root); err != nil {
			continue
		}
		var dirs []string
		_ = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, path)
				killCgroup(path)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			if err := removeCgroupDir(dirs[i]); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

func killCgroup(dir string) {
	raw, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return
	}
	for _, f := range strings.Fields(string(raw)) {
		var pid int
		if _, err := fmt.Sscan(f, &pid); err == nil {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// removeCgroupDir retries briefly: a killed process leaves its cgroup a
// moment after the signal.
func removeCgroupDir(dir string) error {
	var err error
	for range 50 {
		if err = syscall.Rmdir(dir); err == nil || errors.Is(err, syscall.ENOENT) {
			return nil
		}
		killCgroup(dir)
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("removing cgroup %s: %w", dir, err)
}

// removeNetns deletes the pods' network namespaces containerd created:
// those not in before.
func removeNetns(before map[string]bool) error {
	entries, err := os.ReadDir("/var/run/netns")
	if err != nil {
		return nil
	}
	var errs []error
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "cni-") || before[e.Name()] {
			continue
		}
		p := filepath.Join("/var/run/netns", e.Name())
		_ = syscall.Unmount(p, syscall.MNT_DETACH)
		if err := os.Remove(p); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func run(ctx context.Context, name string, args ...string) error {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// PauseKubelet freezes the real node's kubelet (SIGSTOP), as a partition
// would cut it off: its containers keep running in containerd, nothing
// reports on them, and nothing refreshes their Downward API files. Call
// the returned function to let it go on (SIGCONT); it is safe to call
// twice, and the cluster's teardown kills a frozen kubelet as well.
func (c *Cluster) PauseKubelet() (resume func() error, err error) {
	if c.real == nil {
		return nil, errors.New("no real node: start the cluster with RealNode")
	}
	for _, p := range c.real.procs {
		if p.name != "kubelet" {
			continue
		}
		if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			return nil, fmt.Errorf("freezing the kubelet: %w", err)
		}
		return func() error { return p.cmd.Process.Signal(syscall.SIGCONT) }, nil
	}
	return nil, errors.New("the real node runs no kubelet")
}
