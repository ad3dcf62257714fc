// Package smoke runs `make dev`'s command for real: the cluster comes up, a
// Deployment of pause pods becomes Ready on kwok nodes, and stopping it leaves
// no process behind.
package smoke

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencer-io/fencer/test/support/testenv"
)

const deployment = `apiVersion: apps/v1
kind: Deployment
metadata:
  name: pause
spec:
  replicas: 3
  selector:
    matchLabels: {app: pause}
  template:
    metadata:
      labels: {app: pause}
    spec:
      containers:
      - name: pause
        image: registry.k8s.io/pause:3.10
`

func TestDevCluster(t *testing.T) {
	bin, err := testenv.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{"fencer", "kube-controller-manager", "kube-scheduler", "kwok"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			t.Fatalf("%s missing from %s: run `make tools build`", b, bin)
		}
	}
	tmp := t.TempDir()
	devBin := filepath.Join(tmp, "dev")
	build := exec.Command("go", "build", "-o", devBin, "./hack/dev")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building hack/dev: %v\n%s", err, out)
	}

	state := filepath.Join(tmp, "state")
	dev := exec.Command(devBin, "--dir", state, "--bin", bin,
		"--manager", filepath.Join(bin, "fencer"),
		"--crds", filepath.Join(root, "config", "crd", "bases"),
		"--webhook", filepath.Join(root, "config", "webhook", "manifests.yaml"),
		"--guard", filepath.Join(root, "config", "guard", "policies.yaml"),
		"--tools", filepath.Join(root, "hack", "tools"))
	dev.Dir = root
	stdout, err := dev.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	dev.Stderr = dev.Stdout
	if err := dev.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	ready := make(chan struct{})
	var output strings.Builder
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			output.WriteString(line + "\n")
			if line == "fencer dev environment ready" {
				close(ready)
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
		exited <- dev.Wait()
	}()
	defer func() {
		// A failed test must still not leave the cluster running.
		_ = dev.Process.Signal(syscall.SIGKILL)
	}()

	select {
	case <-ready:
	case err := <-exited:
		t.Fatalf("dev exited before it was ready (%v):\n%s", err, output.String())
	case <-time.After(5 * time.Minute):
		t.Fatalf("dev not ready after 5 minutes:\n%s", output.String())
	}
	for _, f := range []string{"kubeconfig", "etcd-endpoints", "etcdctl.env"} {
		if _, err := os.Stat(filepath.Join(state, f)); err != nil {
			t.Fatalf("dev did not write %s: %v", f, err)
		}
	}

	kubectl := func(args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, filepath.Join(bin, "kubectl"), append([]string{"--kubeconfig", filepath.Join(state, "kubeconfig")}, args...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl %v: %v\n%s\nlogs: %s", args, err, out, filepath.Join(state, "logs"))
		}
		return string(out)
	}

	// apply writes manifest to a file named name and applies it.
	apply := func(name, manifest string) {
		t.Helper()
		path := filepath.Join(tmp, name)
		if err := os.WriteFile(path, []byte(manifest), 0o644); err != nil {
			t.Fatal(err)
		}
		kubectl("apply", "-f", path)
	}

	t.Run("real version strings", func(t *testing.T) {
		out := kubectl("version")
		if !strings.Contains(out, "Client Version: v1.37.2") || !strings.Contains(out, "Server Version: v1.37.2") {
			t.Fatalf("kubectl version does not report v1.37.2 for client and server:\n%s", out)
		}
	})
	t.Run("kwok nodes are Ready", func(t *testing.T) {
		out := kubectl("get", "nodes", "-o", `jsonpath={range .items[*]}{.metadata.name}={.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}`)
		lines := strings.Fields(out)
		if len(lines) != 3 {
			t.Fatalf("want 3 nodes, got %q", out)
		}
		for _, l := range lines {
			if !strings.HasSuffix(l, "=True") {
				t.Fatalf("node not Ready: %s", l)
			}
		}
	})
	t.Run("kwok renews node leases", func(t *testing.T) {
		// Without them the node lifecycle controller marks every node and pod
		// not Ready after 50 s; a short smoke test would not see it happen.
		out := kubectl("get", "leases", "-n", "kube-node-lease", "-o", "jsonpath={.items[*].spec.holderIdentity}")
		if len(strings.Fields(out)) != 3 {
			t.Fatalf("want a node lease for each of 3 nodes, got %q", out)
		}
	})
	t.Run("fencer CRDs are served", func(t *testing.T) {
		out := kubectl("get", "flease,idr", "-A")
		if !strings.Contains(out, "No resources found") {
			t.Fatalf("unexpected output: %s", out)
		}
	})
	t.Run("a Lease is stored with fencer's finalizer from its create: the manager writes no finalizer", func(t *testing.T) {
		// The create's own response is the object as stored at admission,
		// before any reconcile could have added the finalizer.
		path := filepath.Join(tmp, "finalized-lease.yaml")
		lease := "apiVersion: fencer.io/v1alpha1\nkind: Lease\nmetadata: {name: finalized, finalizers: [example.com/keep]}\nspec: {holderSelector: {matchLabels: {app: none}}}\n"
		if err := os.WriteFile(path, []byte(lease), 0o644); err != nil {
			t.Fatal(err)
		}
		if got := kubectl("create", "-f", path, "-o", "jsonpath={.metadata.finalizers}"); got != `["example.com/keep","fencer.io/release"]` {
			t.Errorf("the created Lease carries finalizers %s; want the client's and then fencer.io/release, set by lease-finalizer.fencer.io", got)
		}
		kubectl("patch", "flease", "finalized", "--type=json", "-p", `[{"op":"remove","path":"/metadata/finalizers/0"}]`)
		kubectl("delete", "flease", "finalized", "--wait=true", "--timeout=60s")
	})

	t.Run("a Deployment's pods become Ready and are deleted", func(t *testing.T) {
		manifest := filepath.Join(tmp, "deployment.yaml")
		if err := os.WriteFile(manifest, []byte(deployment), 0o644); err != nil {
			t.Fatal(err)
		}
		kubectl("apply", "-f", manifest)
		kubectl("rollout", "status", "deployment/pause", "--timeout=120s")
		out := kubectl("get", "pods", "-l", "app=pause", "-o", `jsonpath={range .items[*]}{.spec.nodeName},{.status.phase},{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}`)
		pods := strings.Fields(out)
		if len(pods) != 3 {
			t.Fatalf("want 3 pods, got %q", out)
		}
		for _, p := range pods {
			f := strings.Split(p, ",")
			if len(f) != 3 || !strings.HasPrefix(f[0], "kwok-node-") || f[1] != "Running" || f[2] != "True" {
				t.Fatalf("pod not scheduled, Running and Ready on a kwok node: %s", p)
			}
		}
		kubectl("delete", "deployment", "pause", "--wait=true")
		kubectl("wait", "--for=delete", "pod", "-l", "app=pause", "--timeout=120s")
	})

	t.Run("the example Lease is granted with the etcd CreateRevision as token", func(t *testing.T) {
		kubectl("apply", "-f", filepath.Join(root, "examples", "lease.yaml"), "-f", filepath.Join(root, "examples", "lease-workers.yaml"))
		kubectl("rollout", "status", "deployment/reporter", "--timeout=120s")
		// The Ready condition is what kubectl wait, kstatus and Argo CD read.
		kubectl("wait", "--for=condition=Ready", "flease/report", "--timeout=60s")
		var holder, token string
		deadline := time.Now().Add(60 * time.Second)
		for holder == "" && time.Now().Before(deadline) {
			f := strings.Fields(kubectl("get", "flease", "report", "-o", "jsonpath={.status.holder} {.status.token}"))
			if len(f) == 2 {
				holder, token = f[0], f[1]
			} else {
				time.Sleep(200 * time.Millisecond)
			}
		}
		if holder == "" {
			t.Fatal("the example Lease was never granted")
		}
		// As the README runs it: the env file carries endpoint and identity.
		out, err := exec.Command("bash", "-c", ". "+filepath.Join(state, "etcdctl.env")+" && "+filepath.Join(bin, "etcdctl")+
			" get /fencer/leases/default/report -w json").CombinedOutput()
		if err != nil {
			t.Fatalf("etcdctl: %v\n%s", err, out)
		}
		// fencer's etcd is locked: no certificate, no answer.
		endpoints, err := os.ReadFile(filepath.Join(state, "etcd-endpoints"))
		if err != nil {
			t.Fatal(err)
		}
		if anon, err := exec.Command(filepath.Join(bin, "etcdctl"), "--endpoints="+strings.TrimSpace(string(endpoints)), "--dial-timeout=2s", "--command-timeout=3s",
			"get", "/fencer/leases/default/report").CombinedOutput(); err == nil {
			t.Fatalf("etcdctl without a certificate read a lease key:\n%s", anon)
		}
		// The namespace has a Lease, so it has its etcd identity.
		if got := kubectl("get", "secret", "fencer-etcd-client", "-o", "jsonpath={.data.prefix}"); got == "" {
			t.Fatal("the default namespace has no fencer-etcd-client Secret")
		}
		if want := `"create_revision":` + token + ","; !strings.Contains(string(out), want) {
			t.Fatalf("TOKEN %s is not the key's create_revision:\n%s", token, out)
		}
		ann := kubectl("get", "pod", holder, "-o", `jsonpath={.metadata.annotations.lease\.fencer\.io/report}`)
		if ann != token {
			t.Fatalf("holder %s carries annotation %q, want %s", holder, ann, token)
		}

		// The webhook: a fenced ConfigMap with a stale token is refused with
		// fencer's message; with the live token it is written.
		tok, _ := strconv.ParseInt(token, 10, 64)
		cm := func(tok int64) string {
			path := filepath.Join(tmp, fmt.Sprintf("cm-%d.yaml", tok))
			manifest := fmt.Sprintf("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: report-output\n  labels: {fencer.io/lease: report}\n  annotations: {fencer.io/token: %q}\ndata: {written-by: %q}\n", strconv.FormatInt(tok, 10), holder)
			if err := os.WriteFile(path, []byte(manifest), 0o644); err != nil {
				t.Fatal(err)
			}
			return path
		}
		out, err = exec.Command(filepath.Join(bin, "kubectl"), "--kubeconfig", filepath.Join(state, "kubeconfig"), "apply", "-f", cm(tok-1)).CombinedOutput()
		// The Lease's status records tok, so the webhook refuses without
		// reading etcd, and says so.
		want := fmt.Sprintf("fencer: stale token %d for lease default/report: token %d has been issued since, as the Lease's status records [lease default/report; offered token \"%d\"; recorded token none; current token %d; holder %s]",
			tok-1, tok, tok-1, tok, holder)
		if err == nil || !strings.Contains(string(out), want) {
			t.Fatalf("stale write: err=%v, output:\n%s\nwant it refused with %q", err, out, want)
		}
		kubectl("apply", "-f", cm(tok))

		// What a careless admin sends with kubectl, none of which sends the
		// token itself: each is refused, with the reason.
		refused := func(want string, args ...string) {
			t.Helper()
			out, err := exec.Command(filepath.Join(bin, "kubectl"), append([]string{"--kubeconfig", filepath.Join(state, "kubeconfig")}, args...)...).CombinedOutput()
			if err == nil || !strings.Contains(string(out), want) {
				t.Fatalf("kubectl %v: err=%v, output:\n%s\nwant it refused with %q", args, err, out, want)
			}
		}
		noToken := "this write sends no fencing token for lease default/report"
		refused(noToken, "patch", "cm", "report-output", "--type=merge", "-p", `{"data":{"v":"x"}}`)
		refused(noToken, "label", "cm", "report-output", "fencer.io/lease-")
		refused(noToken, "annotate", "cm", "report-output", "note=x")
		refused("a DELETE cannot carry a fencing token", "delete", "cm", "report-output")
		kubectl("patch", "cm", "report-output", "--type=merge", "-p", fmt.Sprintf(`{"data":{"v":"x"},"metadata":{"annotations":{"fencer.io/token":"%d"}}}`, tok))
		if got := kubectl("get", "cm", "report-output", "-o", `jsonpath={.metadata.annotations.fencer\.io/written-token}/{.metadata.annotations.fencer\.io/token}`); got != token+"/" {
			t.Fatalf("stored record/offer %q, want %s/ (the offer never stays on the object)", got, token)
		}
		traceable(t, state, output.String(), kubectl)
	})

	t.Run("kubectl scale of a fenced Deployment is refused", func(t *testing.T) {
		token := strings.TrimSpace(kubectl("get", "flease", "report", "-o", "jsonpath={.status.token}"))
		apply("fenced-deployment.yaml", fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata:
  name: fenced
  labels: {fencer.io/lease: report}
  annotations: {fencer.io/token: %q}
spec:
  replicas: 1
  selector: {matchLabels: {app: fenced}}
  template:
    metadata: {labels: {app: fenced}}
    spec: {containers: [{name: c, image: registry.k8s.io/pause:3.10}]}
`, token))
		out, err := exec.Command(filepath.Join(bin, "kubectl"), "--kubeconfig", filepath.Join(state, "kubeconfig"), "scale", "deployment", "fenced", "--replicas=3").CombinedOutput()
		if err == nil || !strings.Contains(string(out), "a UPDATE of the scale subresource cannot carry a fencing token") {
			t.Fatalf("kubectl scale of a fenced Deployment: err=%v\n%s", err, out)
		}
	})

	t.Run("kubectl delete namespace completes with fenced objects in it", func(t *testing.T) {
		apply("fenced-ns.yaml", `apiVersion: v1
kind: Namespace
metadata: {name: fenced-ns}
---
apiVersion: fencer.io/v1alpha1
kind: Lease
metadata: {name: job, namespace: fenced-ns}
spec:
  ttlSeconds: 10
  holderSelector: {matchLabels: {app: job}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: job, namespace: fenced-ns}
spec:
  replicas: 1
  selector: {matchLabels: {app: job}}
  template:
    metadata: {labels: {app: job}}
    spec: {containers: [{name: c, image: registry.k8s.io/pause:3.10}]}
`)
		var token string
		for deadline := time.Now().Add(90 * time.Second); token == "" || token == "0"; time.Sleep(500 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("Lease fenced-ns/job not held after 90s")
			}
			token = strings.TrimSpace(kubectl("get", "flease", "job", "-n", "fenced-ns", "-o", "jsonpath={.status.token}"))
		}
		apply("fenced-ns-cm.yaml", fmt.Sprintf("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: out\n  namespace: fenced-ns\n  labels: {fencer.io/lease: job}\n  annotations: {fencer.io/token: %q}\n", token))
		kubectl("delete", "namespace", "fenced-ns", "--wait=true", "--timeout=120s")
	})

	t.Run("the example IDRanges hand out distinct blocks and slots (disjointness is proven in test/integration/idrange)", func(t *testing.T) {
		ex := filepath.Join(root, "examples")
		kubectl("apply", "-f", filepath.Join(ex, "idrange-blocks.yaml"), "-f", filepath.Join(ex, "idrange-slots.yaml"), "-f", filepath.Join(ex, "idrange-workers.yaml"))
		kubectl("rollout", "status", "deployment/orders", "deployment/events", "--timeout=120s")
		deadline := time.Now().Add(60 * time.Second)
		for {
			out := kubectl("get", "pods", "-l", "app in (orders,events)", "-o",
				`jsonpath={range .items[*]}{.metadata.annotations.idrange\.fencer\.io/order-ids}{.metadata.annotations.idrange\.fencer\.io/event-workers}{"\n"}{end}`)
			vals := strings.Fields(out)
			seen := map[string]bool{}
			for _, v := range vals {
				seen[strings.Split(v, ",")[0]] = true // block=a-b, or slot=n
			}
			if len(vals) == 6 && len(seen) == 6 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("want 3 distinct blocks and 3 distinct slots, got %q", out)
			}
			time.Sleep(200 * time.Millisecond)
		}
	})

	t.Run("metrics: HTTPS behind TokenReview and SubjectAccessReview; the shipped alerts and dashboard read only exported metrics", func(t *testing.T) {
		checkMetrics(t, root, bin, output.String(), kubectl)
	})

	t.Run("kubectl fencer: status, history, check, ids and locks, golden", func(t *testing.T) {
		runPlugin(t, root, bin, filepath.Join(state, "kubeconfig"), kubectl, apply)
	})

	t.Run("the example stories: an anomaly without fencer, none with it", func(t *testing.T) {
		runStories(t, root, filepath.Join(state, "kubeconfig"))
	})

	t.Run("the chart's helm test hook passes against fencer and fails without its webhook", func(t *testing.T) {
		runHelmTestHook(t, bin, root, filepath.Join(state, "kubeconfig"), kubectl)
	})

	if err := dev.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("dev exited with %v after SIGINT:\n%s", err, output.String())
		}
	case <-time.After(90 * time.Second):
		t.Fatalf("dev did not stop within 90s of SIGINT:\n%s", output.String())
	}
	if left := processesMentioning(state); len(left) > 0 {
		t.Fatalf("processes left behind after shutdown:\n%s", strings.Join(left, "\n"))
	}
}

// processesMentioning lists the live processes whose command line names dir.
// Every process the dev cluster starts is given a path below its state
// directory (data dir, kubeconfig or certificates), so none can hide.
func processesMentioning(dir string) []string {
	entries, _ := os.ReadDir("/proc")
	var found []string
	for _, e := range entries {
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(raw) == 0 {
			continue
		}
		cmdline := strings.ReplaceAll(string(raw), "\x00", " ")
		if strings.Contains(cmdline, dir) && !isZombie(e.Name()) {
			found = append(found, fmt.Sprintf("pid %s: %s", e.Name(), cmdline))
		}
	}
	return found
}

func isZombie(pid string) bool {
	raw, err := os.ReadFile(filepath.Join("/proc", pid, "stat"))
	if err != nil {
		return true
	}
	s := string(raw)
	i := strings.LastIndex(s, ")")
	return i > 0 && len(s) > i+2 && s[i+2] == 'Z'
}
