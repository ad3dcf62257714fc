// Package realnode runs fencer against a real node: a kubelet with
// containerd, runc and CNI on this machine, next to kwok nodes
// (`make test-real-node`, root only). It proves what kwok cannot: a holder
// pod's token reaches a running container through its Downward API file,
// how fast the kubelet refreshes that file, and that the node is torn down
// to the machine's previous state.
package realnode

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/fencer-io/fencer/internal/devcluster"
	"github.com/fencer-io/fencer/internal/testenv"
)

// machineState is what the real node may change and teardown must restore.
func machineState(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for _, k := range []string{"vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops"} {
		raw, err := os.ReadFile(filepath.Join("/proc/sys", k))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s=%s ", k, strings.TrimSpace(string(raw)))
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
	out, _ := exec.Command("pgrep", "-a", "^(containerd|kubelet|pause|worker)").Output()
	var live []string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		// A killed shim or container is a zombie until this machine's
		// PID 1 reaps it; it holds nothing but its process ID.
		if l != "" && !strings.HasSuffix(l, "<defunct>") {
			live = append(live, l)
		}
	}
	fmt.Fprintf(&b, "processes=%q", live)
	return b.String()
}

func TestRealNode(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("the real node needs root: run `make test-real-node` as root (docs/development.md)")
	}
	before := machineState(t)
	// Twice: the second run proves the first left nothing behind.
	for run := 1; run <= 2; run++ {
		t.Run(fmt.Sprintf("run %d", run), func(t *testing.T) { realNodeRun(t, run == 1) })
		if after := machineState(t); after != before {
			t.Fatalf("teardown left the machine changed:\nbefore %s\nafter  %s", before, after)
		}
	}
}

func realNodeRun(t *testing.T, measure bool) {
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
	if !measure {
		return
	}
	measureDownwardAPI(t, c, file)
	electRealWorkers(t, c, root)
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

// electRealWorkers runs the fencer manager, and a Lease over three worker
// pods in real containers. The holder reads its token from its Downward API
// file and from the API, and writes a fenced ConfigMap with it. Killing the
// holder's container process, and then the whole pod, hands the Lease on,
// and the next holder's write carries a larger token.
func electRealWorkers(t *testing.T, c *devcluster.Cluster, root string) {
	ctx := context.Background()
	bin, _ := testenv.BinDir()
	if err := c.InstallCRDs(ctx, filepath.Join(root, "config", "crd", "bases")); err != nil {
		t.Fatal(err)
	}
	if err := c.StartManager(ctx, filepath.Join(bin, "fencer")); err != nil {
		t.Fatal(err)
	}
	if err := c.InstallWebhook(ctx, filepath.Join(root, "config", "webhook", "manifests.yaml")); err != nil {
		t.Fatal(err)
	}
	worker := filepath.Join(t.TempDir(), "worker")
	build := exec.Command("go", "build", "-trimpath", "-o", worker, "./test/realnode/worker")
	build.Dir, build.Env = root, append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the worker: %v\n%s", err, out)
	}
	if err := c.BuildImage(ctx, worker, "fencer.test/realnode-worker:dev", "worker", "65532:65532"); err != nil {
		t.Fatal(err)
	}
	kubectl := func(args ...string) string {
		t.Helper()
		out, err := c.Kubectl(ctx, args...)
		if err != nil {
			t.Fatalf("kubectl %s: %v", strings.Join(args, " "), err)
		}
		return out
	}
	kubectl("create", "role", "worker", "--verb=get,list,watch", "--resource=pods", "-n", "default")
	kubectl("create", "role", "worker-cm", "--verb=get,create,update,patch", "--resource=configmaps", "-n", "default")
	kubectl("create", "rolebinding", "worker", "--role=worker", "--serviceaccount=default:default", "-n", "default")
	kubectl("create", "rolebinding", "worker-cm", "--role=worker-cm", "--serviceaccount=default:default", "-n", "default")
	host, port := c.PodAPIServer()
	manifest := `apiVersion: fencer.io/v1alpha1
kind: Lease
metadata: {name: report, namespace: default}
spec: {ttlSeconds: 5, holderSelector: {matchLabels: {app: worker}}}
`
	for i := range 3 {
		manifest += fmt.Sprintf(`---
apiVersion: v1
kind: Pod
metadata: {name: worker-%d, namespace: default, labels: {app: worker}}
spec:
  nodeName: %s
  containers:
  - name: worker
    image: fencer.test/realnode-worker:dev
    imagePullPolicy: Never
    env:
    - {name: KUBERNETES_SERVICE_HOST, value: %q}
    - {name: KUBERNETES_SERVICE_PORT, value: %q}
    - {name: LEASE, value: report}
    - name: POD_NAME
      valueFrom: {fieldRef: {fieldPath: metadata.name}}
    - name: POD_NAMESPACE
      valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
    volumeMounts: [{name: podinfo, mountPath: /etc/podinfo}]
  volumes:
  - name: podinfo
    downwardAPI: {items: [{path: annotations, fieldRef: {fieldPath: metadata.annotations}}]}
`, i, devcluster.RealNodeName, host, port)
	}
	path := filepath.Join(t.TempDir(), "workers.yaml")
	if err := os.WriteFile(path, []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	kubectl("apply", "-f", path)

	first := waitWrite(t, c, 0)
	t.Logf("pods on the real node:\n%s", kubectl("get", "pods", "-o", "wide"))
	t.Logf("first tenure: %s wrote report-output under token %s", first.writer, first.token)

	// Kill the holder's container process; the kubelet restarts it.
	killWorker(t, c, first.writer)
	// Then delete the holder pod: the next holder writes a larger token.
	kubectl("delete", "pod", first.writer, "--wait=false")
	next := waitWrite(t, c, mustInt(t, first.token))
	if next.writer == first.writer {
		t.Fatalf("the deleted holder %s wrote again", next.writer)
	}
	t.Logf("after the holder was killed and deleted: %s wrote under token %s (> %s)", next.writer, next.token, first.token)
}

type written struct{ writer, token string }

// waitWrite waits until report-output was written under a token above
// above, and that token is the Lease's.
func waitWrite(t *testing.T, c *devcluster.Cluster, above int64) written {
	t.Helper()
	ctx := context.Background()
	var w written
	waitFor(t, 90*time.Second, fmt.Sprintf("a fenced write under a token above %d", above), func() (bool, error) {
		cm, err := c.Client.CoreV1().ConfigMaps("default").Get(ctx, "report-output", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		w = written{writer: cm.Data["writer"], token: cm.Data["token"]}
		tok, _ := strconvParse(w.token)
		if tok <= above {
			return false, nil
		}
		status, err := c.Kubectl(ctx, "get", "flease", "report", "-o", "jsonpath={.status.token}")
		return err == nil && strings.TrimSpace(status) == w.token, nil
	})
	return w
}

// killWorker SIGKILLs the worker process of pod, found by its cgroup.
func killWorker(t *testing.T, c *devcluster.Cluster, pod string) {
	t.Helper()
	p, err := c.Client.CoreV1().Pods("default").Get(context.Background(), pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	uid := strings.ReplaceAll(string(p.UID), "-", "_")
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		comm, err := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
		if err != nil || strings.TrimSpace(string(comm)) != "worker" {
			continue
		}
		cg, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup"))
		if !strings.Contains(string(cg), string(p.UID)) && !strings.Contains(string(cg), uid) {
			continue
		}
		if err := exec.Command("kill", "-9", e.Name()).Run(); err != nil {
			t.Fatal(err)
		}
		t.Logf("killed %s's worker process %s", pod, e.Name())
		return
	}
	t.Fatalf("no worker process of %s found", pod)
}

func mustInt(t *testing.T, s string) int64 {
	t.Helper()
	n, err := strconvParse(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func strconvParse(s string) (int64, error) { return strconv.ParseInt(s, 10, 64) }
