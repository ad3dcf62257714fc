// Package realnode runs fencer against a real node: a kubelet with
// containerd, runc and CNI, kube-proxy and CoreDNS on this machine, next to
// kwok nodes (`make test-real-node`, root only). It proves what kwok cannot:
// the chart installs and runs as pods, `helm test` tells a working webhook
// from a broken one, a holder pod's token reaches a running container
// through its Downward API file (and how fast the kubelet refreshes that
// file), an IDRange consumer survives a real container restart without
// repeating an ID, a workload member cut off by a real partition (its
// kubelet frozen, its pod force-deleted, its replacement elsewhere) keeps
// writing and is refused by fencer at every fence, and the node is torn
// down to the machine's previous state.
package realnode

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/fencer-io/fencer/test/support/devcluster"
	"github.com/fencer-io/fencer/test/support/testenv"
)

// machineState is what the real node may change and teardown must restore.
func machineState(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for _, k := range devcluster.KernelSettings {
		raw, err := os.ReadFile(filepath.Join("/proc/sys", k))
		if err == nil {
			fmt.Fprintf(&b, "%s=%s ", k, strings.TrimSpace(string(raw)))
		}
	}
	_, bridge := os.Stat("/sys/class/net/fencer0")
	fmt.Fprintf(&b, "bridge=%v ", bridge == nil)
	cg, _ := filepath.Glob("/sys/fs/cgroup/*/kubepods")
	fmt.Fprintf(&b, "kubepods=%d ", len(cg))
	netns, _ := filepath.Glob("/var/run/netns/cni-*")
	fmt.Fprintf(&b, "netns=%d ", len(netns))
	for _, d := range []string{"/var/log/pods", "/var/log/containers", "/var/run/netns"} {
		_, err := os.Stat(d)
		fmt.Fprintf(&b, "%s=%v ", d, err == nil)
	}
	out, _ := exec.Command("pgrep", "-a", "^(containerd|kubelet|kube-proxy|coredns|pause|worker|ids|story|etcd|fencer)").Output()
	var live []string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		// A killed shim or container is a zombie until this machine's
		// PID 1 reaps it; it holds nothing but its process ID.
		if l != "" && !strings.HasSuffix(l, "<defunct>") {
			live = append(live, l)
		}
	}
	fmt.Fprintf(&b, "processes=%q\n", live)
	b.WriteString(firewallRules(t, "iptables-save"))
	b.WriteString(firewallRules(t, "ip6tables-save"))
	return b.String()
}

// firewallRules lists the rules and user chains of every table. A table
// with neither is the same as no table, whatever its built-in chains. A
// machine without iptables has no rules of it: the real node installs the
// package, and its teardown must still leave no rule behind.
func firewallRules(t *testing.T, save string) string {
	t.Helper()
	out, err := exec.Command(save).Output()
	if errors.Is(err, exec.ErrNotFound) {
		return ""
	}
	if err != nil {
		t.Fatalf("%s: %v", save, err)
	}
	var b strings.Builder
	table := ""
	for _, l := range strings.Split(string(out), "\n") {
		switch {
		case strings.HasPrefix(l, "*"):
			table = l
		case strings.HasPrefix(l, "-A"), strings.HasPrefix(l, ":") && strings.Contains(l, " - "):
			fmt.Fprintf(&b, "%s %s %s\n", save, table, l)
		}
	}
	return b.String()
}

func TestRealNode(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("the real node needs root: run `make test-real-node` as root (docs/development.md)")
	}
	before := machineState(t)
	// Twice: the second run proves the first left nothing behind. The
	// first measures the Downward API and plays the example stories as
	// pods; the second installs the chart.
	for run := 1; run <= 2; run++ {
		t.Run(fmt.Sprintf("run %d", run), func(t *testing.T) { realNodeRun(t, run) })
		if after := machineState(t); after != before {
			t.Fatalf("teardown left the machine changed:\nbefore %s\nafter  %s", before, after)
		}
	}
}

func realNodeRun(t *testing.T, run int) {
	ctx := context.Background()
	bin, err := testenv.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	stages, err := devcluster.KwokStages(ctx, filepath.Join(root, "hack", "tools"))
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "cluster")
	t.Cleanup(func() { keepLogs(t, dir, run) })
	c, err := devcluster.Start(ctx, devcluster.Options{BinDir: bin, Dir: dir, Nodes: 1, KwokStages: stages, RealNode: true, Log: testWriter{t}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := c.Stop(); err != nil {
			t.Errorf("teardown: %v", err)
		}
	}()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "reader", Namespace: "default", Annotations: map[string]string{"lease.fencer.io/report": "0"}},
		Spec: corev1.PodSpec{
			NodeName: devcluster.RealNodeName,
			Containers: []corev1.Container{{
				Name: "c", Image: "registry.k8s.io/pause:3.10", ImagePullPolicy: corev1.PullNever,
				VolumeMounts: []corev1.VolumeMount{{Name: "podinfo", MountPath: "/etc/podinfo"}},
			}},
			Volumes: []corev1.Volume{{Name: "podinfo", VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{
				Items: []corev1.DownwardAPIVolumeFile{{Path: "annotations", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.annotations"}}},
			}}}},
		},
	}
	created, err := c.Client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	waitFor(t, 60*time.Second, "the pod Running on the real node", func() (bool, error) {
		p, err := c.Client.CoreV1().Pods("default").Get(ctx, "reader", metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodRunning, err
	})
	t.Logf("pod Running %s after create", time.Since(start).Round(time.Millisecond))
	// The file the container reads at /etc/podinfo/annotations.
	file := filepath.Join(c.RealNodeDir(), "kubelet", "pods", string(created.UID), "volumes", "kubernetes.io~downward-api", "podinfo", "annotations")
	if run == 1 {
		bridge := bridgeAddress(t)
		measureDownwardAPI(t, c, file)
		startLocalFencer(t, c, root)
		storiesAsPods(t, c, root)
		partitionMembers(t, c, root)
		// Dozens of pods came and went: the gateway's MAC, in every pod's
		// ARP cache, must not have moved with them.
		if after := bridgeAddress(t); after != bridge {
			t.Errorf("the bridge's MAC changed while pods came and went: %s, then %s", bridge, after)
		}
		return
	}
	chartOnRealNode(t, c, root)
}

func measureDownwardAPI(t *testing.T, c *devcluster.Cluster, file string) {
	ctx := context.Background()
	var lat []time.Duration
	for i := 1; i <= 20; i++ {
		want := fmt.Sprintf(`lease.fencer.io/report="%d"`, 1000+i)
		patch := fmt.Sprintf(`{"metadata":{"annotations":{"lease.fencer.io/report":"%d"}}}`, 1000+i)
		if _, err := c.Client.CoreV1().Pods("default").Patch(ctx, "reader", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		written := time.Now()
		waitFor(t, 2*time.Minute, "the annotation in the Downward API file", func() (bool, error) {
			raw, err := os.ReadFile(file)
			return err == nil && strings.Contains(string(raw), want), nil
		})
		lat = append(lat, time.Since(written))
		time.Sleep(time.Duration(i%5) * 300 * time.Millisecond) // vary the phase against the kubelet's loops
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	t.Logf("Downward API refresh after a pod annotation changes, 20 changes: min %s, median %s, p90 %s, max %s",
		lat[0].Round(time.Millisecond), lat[10].Round(time.Millisecond), lat[17].Round(time.Millisecond), lat[19].Round(time.Millisecond))
}

// bridgeAddress is the pods' bridge's MAC, which must have been set
// (addr_assign_type 3), not taken from a port: a bridge with a random
// address moves to its lowest port's MAC as pods start and stop.
func bridgeAddress(t *testing.T) string {
	t.Helper()
	read := func(name string) string {
		raw, err := os.ReadFile(filepath.Join("/sys/class/net/fencer0", name))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(raw))
	}
	if kind := read("addr_assign_type"); kind != "3" {
		t.Errorf("the bridge's MAC was not set when it was created (addr_assign_type %s, want 3): it follows its ports", kind)
	}
	return read("address")
}

func waitFor(t *testing.T, timeout time.Duration, what string, done func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, err := done()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %s (%v)", what, timeout, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// keepLogs copies a failed run's component logs out of its temporary
// directory, which the test removes, and says where.
func keepLogs(t *testing.T, dir string, run int) {
	if !t.Failed() {
		return
	}
	keep := filepath.Join(os.TempDir(), "fencer-realnode-logs", fmt.Sprintf("run-%d", run))
	_ = os.RemoveAll(keep)
	if err := exec.Command("cp", "-r", filepath.Join(dir, "logs"), keep).Run(); err == nil {
		t.Logf("the components' logs are in %s", keep)
	}
	// The containers' logs, which the kubelet writes below the node's directory.
	if err := exec.Command("cp", "-r", filepath.Join(dir, "real-node", "pod-logs"), filepath.Join(keep, "pods")).Run(); err == nil {
		t.Logf("the pods' logs are in %s", filepath.Join(keep, "pods"))
	}
}
