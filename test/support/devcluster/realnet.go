package devcluster

import (
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
)

// The real node's Services: kube-proxy (iptables mode) routes ClusterIPs,
// and CoreDNS, on the bridge address, answers for cluster.local, as in a
// kubeadm cluster. Both run as processes on this machine, not as pods.
const (
	clusterDomain = "cluster.local"
	// serviceSubnet is the apiserver's --service-cluster-ip-range, and
	// kubernetesServiceIP its first address, the kubernetes Service's.
	serviceSubnet       = "10.0.0.0/24"
	kubernetesServiceIP = "10.0.0.1"
)

// bridge creates the pods' bridge with the node's address on it. The
// kubelet refuses a loopback node IP; the apiserver advertises this
// address, and CoreDNS listens on it. Its MAC is fixed (realBridgeMAC).
func (n *realNode) bridge(ctx context.Context) error {
	_ = run(ctx, "ip", "link", "del", realBridge) // left by a run that was killed
	for _, args := range [][]string{
		{"link", "add", realBridge, "address", realBridgeMAC, "type", "bridge"},
		{"addr", "add", realBridgeIP + "/24", "dev", realBridge},
		{"link", "set", realBridge, "up"},
	} {
		if err := run(ctx, "ip", args...); err != nil {
			return err
		}
	}
	n.undo = append(n.undo, func() error { return run(context.Background(), "ip", "link", "del", realBridge) })
	return nil
}

// saveMachineState records the machine's iptables rules (the kubelet and
// kube-proxy add chains to them) and kernel settings, so that teardown can
// put them back exactly.
func (n *realNode) saveMachineState(ctx context.Context) error {
	if err := n.saveKernelSettings(); err != nil {
		return err
	}
	for _, family := range []string{"iptables", "ip6tables"} {
		saved, err := exec.CommandContext(ctx, family+"-save").Output()
		if err != nil {
			return fmt.Errorf("%s-save: %w", family, err)
		}
		n.undo = append(n.undo, func() error { return restoreFirewall(family, string(saved)) })
	}
	return nil
}

// restoreFirewall empties every table the node's components touched and
// loads the rules saved before it started. iptables-restore replaces only
// the tables its input names, so tables that had no rules before are named
// with nothing in them.
func restoreFirewall(family, saved string) error {
	var in strings.Builder
	for _, table := range []string{"filter", "nat", "mangle", "raw"} {
		if !strings.Contains(saved, "*"+table+"\n") {
			fmt.Fprintf(&in, "*%s\nCOMMIT\n", table)
		}
	}
	in.WriteString(saved)
	cmd := exec.Command(family + "-restore")
	cmd.Stdin = strings.NewReader(in.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s-restore: %w: %s", family, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// clusterDNS runs CoreDNS on the bridge address with the kubernetes plugin:
// Services, and the per-pod names of headless Services that the bundled
// etcd's members advertise, resolve as in any cluster.
func (n *realNode) clusterDNS(ctx context.Context) error {
	corefile := fmt.Sprintf(`.:53 {
    bind %s
    errors
    kubernetes %s in-addr.arpa ip6.arpa {
        kubeconfig %s fencer-dev
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
}
`, realBridgeIP, clusterDomain, n.c.Kubeconfig)
	path := filepath.Join(n.dir, "Corefile")
	if err := os.WriteFile(path, []byte(corefile), 0o644); err != nil {
		return err
	}
	p, err := startProc(n.c.opts.Dir, "coredns", n.c.bin("coredns"), "-conf", path)
	if err != nil {
		return err
	}
	n.procs = append(n.procs, p)
	resolver := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, net.JoinHostPort(realBridgeIP, "53"))
	}}
	name := "kubernetes.default.svc." + clusterDomain
	return n.c.poll(ctx, 60*time.Second, "CoreDNS to resolve "+name, func() (bool, error) {
		if err := p.exited(); err != nil {
			return false, err
		}
		qctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		addrs, err := resolver.LookupHost(qctx, name)
		return err == nil && len(addrs) == 1 && addrs[0] == kubernetesServiceIP, nil
	})
}

// kubeProxy runs kube-proxy in iptables mode as the user the bootstrap
// RBAC binds to system:node-proxier. The flags keep it from changing
// kernel settings the rest of the machine relies on: conntrack sizes and
// timeouts stay as they are, and localhost NodePorts (route_localnet) off.
func (n *realNode) kubeProxy(ctx context.Context) error {
	if err := n.c.pki.issue("kube-proxy", pkix.Name{CommonName: "system:kube-proxy"}, false, nil, nil); err != nil {
		return err
	}
	kubeconfig := filepath.Join(n.dir, "kube-proxy.kubeconfig")
	if err := writeKubeconfig(kubeconfig, n.c.server, n.c.pki.path("ca.crt"), n.c.pki.path("kube-proxy.crt"), n.c.pki.path("kube-proxy.key")); err != nil {
		return err
	}
	ports, err := FreePorts(2)
	if err != nil {
		return err
	}
	healthz := "127.0.0.1:" + strconv.Itoa(ports[0])
	p, err := startProc(n.c.opts.Dir, "kube-proxy", n.c.bin("kube-proxy"),
		"--kubeconfig="+kubeconfig,
		"--proxy-mode=iptables",
		"--cluster-cidr="+realPodSubnet,
		"--hostname-override="+RealNodeName,
		"--bind-address="+realBridgeIP,
		// NodePorts on the node's address only, never on this machine's
		// other interfaces.
		"--nodeport-addresses="+realBridgeIP+"/32",
		"--healthz-bind-address="+healthz,
		"--metrics-bind-address=127.0.0.1:"+strconv.Itoa(ports[1]),
		"--conntrack-max-per-core=0",
		"--conntrack-tcp-timeout-established=0",
		"--conntrack-tcp-timeout-close-wait=0",
		"--iptables-localhost-nodeports=false",
		"--v=1",
	)
	if err != nil {
		return err
	}
	n.procs = append(n.procs, p)
	// kube-proxy's own cleanup, after it stopped; the saved rules are
	// restored after that.
	n.undo = append(n.undo, func() error {
		out, err := exec.Command(n.c.bin("kube-proxy"), "--cleanup", "--proxy-mode=iptables").CombinedOutput()
		if err != nil {
			return fmt.Errorf("kube-proxy --cleanup: %w: %s", err, out)
		}
		return nil
	})
	return n.c.poll(ctx, 60*time.Second, "kube-proxy healthy", func() (bool, error) {
		if err := p.exited(); err != nil {
			return false, err
		}
		// 200 once it has synced its rules from the apiserver.
		resp, err := (&http.Client{Timeout: time.Second}).Get("http://" + healthz + "/healthz")
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
}
