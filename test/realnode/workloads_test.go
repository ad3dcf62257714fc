package realnode

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fencer-io/fencer/test/support/devcluster"
)

// electRealWorkers runs a Lease over three worker pods in real containers,
// against the manager the chart installed. The holder reads its token from
// its Downward API file and from the API, and writes a fenced ConfigMap
// with it. Killing the holder's container process, and then the whole pod,
// hands the Lease on, and the next holder's write carries a larger token.
func electRealWorkers(t *testing.T, c *devcluster.Cluster, root string) {
	k := kubectlFor(t, c)
	buildImage(t, c, root, "./test/realnode/worker", "fencer.test/realnode-worker:dev", "worker")
	k("create", "role", "worker", "--verb=get,list,watch", "--resource=pods", "-n", "default")
	k("create", "role", "worker-cm", "--verb=get,create,update,patch", "--resource=configmaps", "-n", "default")
	k("create", "rolebinding", "worker", "--role=worker", "--serviceaccount=default:default", "-n", "default")
	k("create", "rolebinding", "worker-cm", "--role=worker-cm", "--serviceaccount=default:default", "-n", "default")
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
  containers:
  - name: worker
    image: fencer.test/realnode-worker:dev
    imagePullPolicy: Never
    env:
    - {name: LEASE, value: report}
    - name: POD_NAME
      valueFrom: {fieldRef: {fieldPath: metadata.name}}
    - name: POD_UID
      valueFrom: {fieldRef: {fieldPath: metadata.uid}}
    - name: POD_NAMESPACE
      valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
    volumeMounts: [{name: podinfo, mountPath: /etc/podinfo}]
  volumes:
  - name: podinfo
    downwardAPI: {items: [{path: annotations, fieldRef: {fieldPath: metadata.annotations}}]}
`, i)
	}
	applyYAML(t, c, manifest)

	first := waitWrite(t, c, 0)
	t.Logf("workers on the real node:\n%s", k("get", "pods", "-l", "app=worker", "-o", "wide"))
	t.Logf("first tenure: %s wrote report-output under token %s", first.writer, first.token)

	// Kill the holder's container process; the kubelet restarts it.
	killProcess(t, c, first.writer, "worker")
	// Then delete the holder pod: the next holder writes a larger token.
	k("delete", "pod", first.writer, "--wait=false")
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
		tok, _ := strconv.ParseInt(w.token, 10, 64)
		if tok <= above {
			return false, nil
		}
		status, err := c.Kubectl(ctx, "get", "flease", "report", "-o", "jsonpath={.status.token}")
		return err == nil && strings.TrimSpace(status) == w.token, nil
	})
	return w
}

// consumeIDsAcrossRestart runs an IDRange consumer (test/realnode/ids) in a
// real container, kills its process in the middle of its annotated block,
// and lets the kubelet restart it. The restarted container must be refused
// the annotated block and issue from blocks of its own: no ID twice.
func consumeIDsAcrossRestart(t *testing.T, c *devcluster.Cluster, root string) {
	ctx := context.Background()
	buildImage(t, c, root, "./test/realnode/ids", "fencer.test/realnode-ids:dev", "ids")
	applyYAML(t, c, `apiVersion: fencer.io/v1alpha1
kind: IDRange
metadata: {name: orders, namespace: default}
spec: {mode: Blocks, min: 1, max: 1000000000, blockSize: 1000, podSelector: {matchLabels: {app: orders}}}
---
apiVersion: v1
kind: Pod
metadata:
  name: orders
  namespace: default
  # The NetworkPolicy the chart installs lets only pods so labeled reach etcd.
  labels: {app: orders, fencer.io/etcd-client: "true"}
spec:
  containers:
  - name: ids
    image: fencer.test/realnode-ids:dev
    imagePullPolicy: Never
    env:
    - {name: IDRANGE, value: orders}
    - {name: MIN, value: "1"}
    - {name: MAX, value: "1000000000"}
    - {name: BLOCK_SIZE, value: "1000"}
    - name: POD_NAME
      valueFrom: {fieldRef: {fieldPath: metadata.name}}
    - name: POD_UID
      valueFrom: {fieldRef: {fieldPath: metadata.uid}}
    - name: POD_NAMESPACE
      valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
    volumeMounts:
    - {name: podinfo, mountPath: /etc/podinfo}
    - {name: etcd, mountPath: /var/run/fencer/etcd, readOnly: true}
    - {name: data, mountPath: /data}
  volumes:
  - name: podinfo
    downwardAPI: {items: [{path: annotations, fieldRef: {fieldPath: metadata.annotations}}]}
  - name: etcd
    secret: {secretName: fencer-etcd-client}
  - name: data
    emptyDir: {}
`)
	pod, err := c.Client.CoreV1().Pods("default").Get(ctx, "orders", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	issued := filepath.Join(c.RealNodeDir(), "kubelet", "pods", string(pod.UID), "volumes", "kubernetes.io~empty-dir", "data", "issued")
	count := func(source string) int {
		raw, _ := os.ReadFile(issued)
		return strings.Count(string(raw), " "+source+"\n")
	}
	waitFor(t, 2*time.Minute, "100 IDs from the annotated block", func() (bool, error) { return count("annotated") >= 100, nil })
	killProcess(t, c, "orders", "ids")
	waitFor(t, 2*time.Minute, "100 IDs from the restarted container's own blocks", func() (bool, error) { return count("claimed") >= 100, nil })

	raw, err := os.ReadFile(issued)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
	for _, l := range lines {
		id := strings.Fields(l)[0]
		if seen[id] {
			t.Fatalf("ID %s was issued twice", id)
		}
		seen[id] = true
	}
	annotated := count("annotated")
	if annotated >= 1000 {
		t.Fatalf("the first container used up its block (%d IDs) before it was killed: the restart did not land mid-block", annotated)
	}
	restarts := k8sRestarts(t, c, "orders")
	if restarts < 1 {
		t.Fatal("the kubelet did not restart the killed container")
	}
	t.Logf("IDRange consumer: %d IDs from the annotated block, killed, restarted by the kubelet (%d restart), then %d IDs from its own blocks: %d IDs, none twice",
		annotated, restarts, count("claimed"), len(lines))
}

func k8sRestarts(t *testing.T, c *devcluster.Cluster, pod string) int32 {
	p, err := c.Client.CoreV1().Pods("default").Get(context.Background(), pod, metav1.GetOptions{})
	if err != nil || len(p.Status.ContainerStatuses) != 1 {
		t.Fatalf("pod %s: %v", pod, err)
	}
	return p.Status.ContainerStatuses[0].RestartCount
}

// killProcess SIGKILLs the process named comm in pod's containers, found by
// its cgroup.
func killProcess(t *testing.T, c *devcluster.Cluster, pod, comm string) {
	t.Helper()
	p, err := c.Client.CoreV1().Pods("default").Get(context.Background(), pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pid, ok := podProcess(p, comm)
	if !ok {
		t.Fatalf("no %s process of pod %s found", comm, pod)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	t.Logf("killed %s's %s process %d", pod, comm, pid)
}

// podProcess finds the process named comm on this machine in pod p's
// cgroup.
func podProcess(p *corev1.Pod, comm string) (int, bool) {
	uid := strings.ReplaceAll(string(p.UID), "-", "_")
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		name, err := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
		if err != nil || strings.TrimSpace(string(name)) != comm {
			continue
		}
		cg, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup"))
		if strings.Contains(string(cg), string(p.UID)) || strings.Contains(string(cg), uid) {
			pid, _ := strconv.Atoi(e.Name())
			return pid, true
		}
	}
	return 0, false
}

func mustInt(t *testing.T, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
