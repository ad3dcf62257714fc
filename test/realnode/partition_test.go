package realnode

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/pkg/dbfence"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
	"github.com/fencer-io/fencer/pkg/fence"
	"github.com/fencer-io/fencer/test/realnode/fencedwrites"
	"github.com/fencer-io/fencer/test/support/devcluster"
	"github.com/fencer-io/fencer/test/support/postgres"
)

// member is one workload of the partition test: a one-member StatefulSet
// or Indexed Job, fenced by its WorkloadLease.
type member struct {
	kind    string // StatefulSet or Job
	name    string // the workload's, and the WorkloadLease's
	renewal string
}

// lease is the member Lease of ordinal or index 0.
func (m member) lease() string { return m.name + "-0" }

// partitionMembers cuts a member's pod off as a partition would, on the
// real node: the kubelet is frozen, so the container keeps running and
// writing, and is force-deleted, so the workload's controller starts a
// replacement on a kwok node. The zombie's writes must then all be refused
// by fencer (not by Kubernetes) at the fenced ConfigMap, the fenced etcd
// key and the guarded database row, while the replacement's pass, and no
// recorded token may ever go down.
func partitionMembers(t *testing.T, c *devcluster.Cluster, root string) {
	k := kubectlFor(t, c)
	db := memberDatabase(t)
	buildImage(t, c, root, "./test/realnode/member", "fencer.test/realnode-member:dev", "member")
	// The zombie's own credential for the API, bound to a ServiceAccount
	// but not to its pod.
	k("create", "serviceaccount", "member", "-n", "default")
	k("create", "role", "member", "--verb=get,create,update,patch", "--resource=configmaps,pods", "-n", "default")
	k("create", "rolebinding", "member", "--role=member", "--serviceaccount=default:member", "-n", "default")
	token := strings.TrimSpace(k("create", "token", "member", "-n", "default", "--duration=2h"))
	k("create", "secret", "generic", "member-token", "--from-literal=token="+token, "-n", "default")
	replacement := replacementTargets(t, c, db)
	for _, m := range []member{
		{kind: "StatefulSet", name: "db-ready", renewal: "PodReady"},
		{kind: "StatefulSet", name: "db-direct", renewal: "Direct"},
		{kind: "Job", name: "batch", renewal: "PodReady"},
	} {
		t.Run(m.name, func(t *testing.T) { partitionMember(t, c, m, db, replacement) })
		if t.Failed() {
			return
		}
	}
}

// memberDatabase runs PostgreSQL for the members, on a unix socket the
// member pods mount from the node, and creates the guard's schema and the
// members' table. It returns the server.
func memberDatabase(t *testing.T) *postgres.Server {
	t.Helper()
	s, err := postgres.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Errorf("stopping PostgreSQL: %v", err)
		}
	})
	// The members run as an unprivileged user: they need to reach the socket.
	if err := os.Chmod(s.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("pgx", s.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	schema, err := fencedwrites.Schema()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(schema); err != nil {
		t.Fatalf("creating the members' schema: %v", err)
	}
	return s
}

// replacementTargets are the test's connections when it writes as a
// replacement, which runs on a kwok node with no process of its own: the
// API as the admin, etcd as the namespace's identity, and the database.
func replacementTargets(t *testing.T, c *devcluster.Cluster, s *postgres.Server) fencedwrites.Targets {
	t.Helper()
	ctx := context.Background()
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := fencerv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	ctrllog.SetLogger(logr.Discard())
	kube, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	// The namespace's etcd identity, as the member pods mount it.
	var secret corev1.Secret
	waitFor(t, 60*time.Second, "the namespace's etcd credentials", func() (bool, error) {
		err := kube.Get(ctx, client.ObjectKey{Namespace: "default", Name: "fencer-etcd-client"}, &secret)
		return err == nil, err
	})
	dir := t.TempDir()
	for name, data := range secret.Data {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	access, err := fence.LoadEtcdAccess(dir)
	if err != nil {
		t.Fatal(err)
	}
	access.Config.Logger = zap.NewNop()
	cli, err := clientv3.New(access.Config)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	install, err := dbfence.InstallOf(ctx, cli, access.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("pgx", s.DSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return fencedwrites.Targets{Kube: kube, Etcd: cli, Prefix: access.Prefix, Namespace: "default", Install: install, DB: db}
}

func partitionMember(t *testing.T, c *devcluster.Cluster, m member, s *postgres.Server, as fencedwrites.Targets) {
	ctx := context.Background()
	k := kubectlFor(t, c)
	kwokNode := "kwok-node-0"
	// The member starts on the real node.
	k("cordon", kwokNode)
	applyYAML(t, c, memberManifest(m, s.Dir))
	zombie := waitMemberPod(t, c, m, "", devcluster.RealNodeName)
	t.Cleanup(func() { removeMember(t, c, m, zombie) })
	logFile := podLog(t, c, zombie, "member")
	// The partition comes once the token is in the Downward API file too:
	// that file is all the zombie will have.
	first := waitRound(t, logFile, 2*time.Minute, "the member's first round with all three writes accepted under the token of its Downward API file", func(r memberRound) bool {
		return r.allOK() && r.FileToken == r.Token
	})
	t1 := first.Token
	t.Logf("%s: %s on the real node writes under token %d", m.name, zombie.Name, t1)

	watch := watchRecordedToken(t, c, m.lease())

	// The partition: the kubelet stops, the container runs on.
	resume, err := c.PauseKubelet()
	if err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	defer func() {
		if err := resume(); err != nil {
			t.Errorf("resuming the kubelet: %v", err)
		}
	}()
	k("uncordon", kwokNode)
	k("cordon", devcluster.RealNodeName)
	defer k("uncordon", devcluster.RealNodeName)
	if m.kind == "Job" {
		waitForTheTerminatingPod(t, c, m, zombie)
	}
	// The operator force-deletes the lost node's pod.
	k("delete", "pod", zombie.Name, "--grace-period=0", "--force")
	deleted := time.Now()

	next := waitMemberPod(t, c, m, zombie.UID, kwokNode)
	placed := time.Now()
	var t2 fence.Token
	waitFor(t, 60*time.Second, "the member Lease granted to the replacement", func() (bool, error) {
		l := &fencerv1.Lease{}
		if err := as.Kube.Get(ctx, client.ObjectKey{Namespace: "default", Name: m.lease()}, l); err != nil {
			return false, err
		}
		pod := &corev1.Pod{}
		if err := as.Kube.Get(ctx, client.ObjectKey{Namespace: "default", Name: next.Name}, pod); err != nil {
			return false, err
		}
		if l.Status.HolderUID != next.UID || l.Status.Token == 0 {
			return false, nil
		}
		tok, err := fence.TokenFromAnnotations(pod.Annotations, m.lease())
		t2 = tok
		return err == nil && tok.Value == l.Status.Token, err
	})
	granted := time.Now()
	if t2.Value <= t1 {
		t.Fatalf("the replacement's token %d is not greater than the zombie's %d", t2.Value, t1)
	}
	if m.renewal == "Direct" {
		// The replacement's process would renew its grant itself; it has
		// none on kwok, so the test does.
		held, err := fence.Hold(ctx, as.Etcd, as.Prefix, "default", t2)
		if err != nil {
			t.Fatalf("holding the replacement's Direct grant: %v", err)
		}
		defer func() {
			if held.Err() != nil {
				t.Errorf("the replacement lost its Direct grant: %v", context.Cause(held))
			}
		}()
	}
	// The replacement writes each target until all three pass: its row
	// raises the database's floor past the zombie's token.
	var firstWrite, allWritten time.Time
	var attempts []fencedwrites.Attempt
	for deadline := time.Now().Add(30 * time.Second); allWritten.IsZero(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the replacement's writes under token %d did not all pass within 30 s: %+v", t2.Value, attempts)
		}
		attempts = as.WriteAll(ctx, t2, next.Name)
		ok := 0
		for _, a := range attempts {
			if a.OK {
				ok++
				if firstWrite.IsZero() {
					firstWrite = time.Now()
				}
			}
		}
		if ok == len(attempts) {
			allWritten = time.Now()
		}
	}
	// The zombie writes on, for ten more rounds.
	waitRounds(t, logFile, 30*time.Second, "ten zombie rounds after the replacement's writes", roundsAfter(10, allWritten))
	t.Logf("%s timeline: kubelet frozen at 0; pod force-deleted +%s; replacement %s on %s +%s; Lease granted to it (token %d > %d) +%s; its first accepted write +%s, all three +%s: %s from the force-delete to its first accepted write",
		m.name, deleted.Sub(paused).Round(time.Millisecond), next.Name, kwokNode, placed.Sub(paused).Round(time.Millisecond), t2.Value, t1,
		granted.Sub(paused).Round(time.Millisecond), firstWrite.Sub(paused).Round(time.Millisecond), allWritten.Sub(paused).Round(time.Millisecond),
		firstWrite.Sub(deleted).Round(time.Millisecond))

	checkZombie(t, readRounds(t, logFile), t1, t2.Value, paused, granted, allWritten)
	// What the replacement wrote before the zombie's ten rounds is still
	// there: a zombie write that landed (even one started in the moment
	// between the grant and the test seeing it) would show here.
	watch.check(t, t2.Value)
	checkFinalState(t, as, s, m.lease(), t2.Value)
	for _, a := range as.WriteAll(ctx, t2, next.Name) {
		if !a.OK {
			t.Errorf("the replacement's write after the zombie's rounds did not pass: %+v", a)
		}
	}
}

// waitForTheTerminatingPod deletes the zombie's pod gracefully, as a
// drain or a taint eviction would: with its kubelet frozen it stays
// terminating, and the Job starts a replacement beside it
// (podReplacementPolicy TerminatingOrFailed). The member Lease must not be
// granted to the replacement while the old pod object exists
// (soleCandidate): Held False, OtherPodsRemain, for longer than a TTL.
func waitForTheTerminatingPod(t *testing.T, c *devcluster.Cluster, m member, zombie *corev1.Pod) {
	t.Helper()
	ctx := context.Background()
	kubectlFor(t, c)("delete", "pod", zombie.Name, "--wait=false")
	next := waitMemberPod(t, c, m, zombie.UID, "kwok-node-0")
	waitFor(t, 30*time.Second, "member Lease "+m.lease()+" Held=False, OtherPodsRemain", func() (bool, error) {
		out, err := c.Kubectl(ctx, "get", "flease", m.lease(), "-o", `jsonpath={.status.conditions[?(@.type=="Held")].reason}`)
		return strings.TrimSpace(out) == fencerv1.ReasonOtherPodsRemain, err
	})
	for deadline := time.Now().Add(8 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		uid, err := c.Kubectl(ctx, "get", "flease", m.lease(), "-o", "jsonpath={.status.holderUID}")
		if err != nil {
			t.Fatal(err)
		}
		if strings.TrimSpace(uid) == string(next.UID) {
			t.Fatalf("member Lease %s granted to the replacement %s while the old pod %s was still terminating", m.lease(), next.Name, zombie.Name)
		}
	}
	t.Logf("%s: the old pod %s terminating on the frozen node, its replacement %s Running on kwok-node-0: the Lease waited (OtherPodsRemain) for 8 s", m.name, zombie.Name, next.Name)
}

// memberManifest is m's WorkloadLease and workload: one member, on a
// node that is not cordoned, running test/realnode/member.
func memberManifest(m member, socketDir string) string {
	wl := fmt.Sprintf(`apiVersion: fencer.io/v1alpha1
kind: WorkloadLease
metadata: {name: %[1]s, namespace: default}
spec:
  workload: {kind: %[2]s, name: %[1]s}
  ttlSeconds: 5
  renewal: %[3]s
---
`, m.name, m.kind, m.renewal)
	env := ""
	restart := "Always"
	if m.kind == "Job" {
		// An Indexed Job's member Lease is <job>-<completion index>.
		env = `
        - {name: JOB_NAME, valueFrom: {fieldRef: {fieldPath: "metadata.labels['batch.kubernetes.io/job-name']"}}}
        - {name: JOB_INDEX, valueFrom: {fieldRef: {fieldPath: "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}}`
		restart = "Never"
	}
	template := fmt.Sprintf(`    metadata:
      labels: {app: %[1]s, fencer.io/etcd-client: "true"}
      annotations: {%[2]s: "true"}
    spec:
      restartPolicy: %[3]s
      terminationGracePeriodSeconds: 5
      containers:
      - name: member
        image: fencer.test/realnode-member:dev
        imagePullPolicy: Never
        env:%[4]s
        - {name: RENEWAL, value: %[5]s}
        - {name: DSN, value: "host=/var/run/postgresql user=postgres dbname=postgres sslmode=disable"}
        - name: POD_NAME
          valueFrom: {fieldRef: {fieldPath: metadata.name}}
        - name: POD_UID
          valueFrom: {fieldRef: {fieldPath: metadata.uid}}
        - name: POD_NAMESPACE
          valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
        volumeMounts:
        - {name: podinfo, mountPath: /etc/podinfo}
        - {name: etcd, mountPath: /var/run/fencer/etcd, readOnly: true}
        - {name: token, mountPath: /etc/member, readOnly: true}
        - {name: postgres, mountPath: /var/run/postgresql}
      volumes:
      - name: podinfo
        downwardAPI: {items: [{path: annotations, fieldRef: {fieldPath: metadata.annotations}}]}
      - name: etcd
        secret: {secretName: fencer-etcd-client}
      - name: token
        secret: {secretName: member-token}
      - name: postgres
        hostPath: {path: %[6]s, type: Directory}
`, m.name, devcluster.KeepRunningAnnotation, restart, env, m.renewal, socketDir)
	if m.kind == "Job" {
		return wl + fmt.Sprintf(`apiVersion: batch/v1
kind: Job
metadata: {name: %s, namespace: default}
spec:
  completionMode: Indexed
  completions: 1
  parallelism: 1
  backoffLimit: 6
  template:
%s`, m.name, template)
	}
	return wl + fmt.Sprintf(`apiVersion: apps/v1
kind: StatefulSet
metadata: {name: %[1]s, namespace: default}
spec:
  replicas: 1
  serviceName: %[1]s
  selector: {matchLabels: {app: %[1]s}}
  template:
%[2]s`, m.name, template)
}

// waitMemberPod waits for m's member pod, other than the one with UID
// not, to run on node, and returns it.
func waitMemberPod(t *testing.T, c *devcluster.Cluster, m member, not types.UID, node string) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	var found *corev1.Pod
	waitFor(t, 90*time.Second, fmt.Sprintf("a pod of %s %s running on %s", m.kind, m.name, node), func() (bool, error) {
		pods, err := c.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=" + m.name})
		if err != nil {
			return false, err
		}
		for i := range pods.Items {
			p := &pods.Items[i]
			if p.UID != not && p.Spec.NodeName == node && p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
				found = p
				return true, nil
			}
		}
		return false, nil
	})
	return found
}

// podLog is the path of a container's log file on the real node, which
// containerd writes even while the kubelet is frozen.
func podLog(t *testing.T, c *devcluster.Cluster, p *corev1.Pod, container string) string {
	return filepath.Join(c.RealNodeDir(), "pod-logs", fmt.Sprintf("%s_%s_%s", p.Namespace, p.Name, p.UID), container, "0.log")
}

// memberRound is one line of the member's log (test/realnode/member).
type memberRound struct {
	At        time.Time              `json:"at"`
	Pod       string                 `json:"pod"`
	FileToken int64                  `json:"fileToken"`
	APIToken  int64                  `json:"apiToken"`
	Token     int64                  `json:"token"`
	APIErr    string                 `json:"apiErr"`
	Hold      string                 `json:"hold"`
	Attempts  []fencedwrites.Attempt `json:"attempts"`
	Err       string                 `json:"err"`
}

func (r memberRound) allOK() bool {
	for _, a := range r.Attempts {
		if !a.OK {
			return false
		}
	}
	return len(r.Attempts) == 3
}

// readRounds parses the member's log: CRI lines, `<time> <stream> <tag> <line>`.
func readRounds(t *testing.T, path string) []memberRound {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("the member's log: %v", err)
	}
	defer f.Close()
	var rounds []memberRound
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		fields := strings.SplitN(sc.Text(), " ", 4)
		if len(fields) < 4 || fields[1] != "stdout" {
			continue
		}
		var r memberRound
		if err := json.Unmarshal([]byte(fields[3]), &r); err != nil {
			t.Fatalf("a line of the member's log is not a round: %q: %v", fields[3], err)
		}
		rounds = append(rounds, r)
	}
	return rounds
}

// waitRound waits until the member's log has a round for which done holds.
func waitRound(t *testing.T, path string, timeout time.Duration, what string, done func(memberRound) bool) memberRound {
	t.Helper()
	var found memberRound
	waitRounds(t, path, timeout, what, func(rounds []memberRound) bool {
		for _, r := range rounds {
			if done(r) {
				found = r
				return true
			}
		}
		return false
	})
	return found
}

// waitRounds waits until done holds for the member's whole log.
func waitRounds(t *testing.T, path string, timeout time.Duration, what string, done func([]memberRound) bool) {
	t.Helper()
	waitFor(t, timeout, what, func() (bool, error) {
		if _, err := os.Stat(path); err != nil {
			return false, err
		}
		ok := done(readRounds(t, path))
		if !ok {
			time.Sleep(100 * time.Millisecond)
		}
		return ok, nil
	})
}

// roundsAfter holds once n rounds began after from.
func roundsAfter(n int, from time.Time) func([]memberRound) bool {
	return func(rounds []memberRound) bool {
		seen := 0
		for _, r := range rounds {
			if r.At.After(from) {
				seen++
			}
		}
		return seen >= n
	}
}

// checkZombie checks the zombie's whole log: its file kept the old token
// once its kubelet was frozen (nothing refreshes it), it never read its successor's
// token from the API, and every write it started after the successor's
// grant (the ConfigMap, the etcd key), or after the successor's first row
// (the database, whose floor is what the guard compares), was refused by
// fencer; no write failed otherwise.
func checkZombie(t *testing.T, rounds []memberRound, t1, t2 int64, paused, granted, replaced time.Time) {
	t.Helper()
	refused := map[string]int{}
	accepted := 0
	for _, r := range rounds {
		if r.At.After(paused) && r.FileToken != t1 {
			t.Errorf("the zombie's Downward API file changed to token %d, from %d, while its kubelet was frozen", r.FileToken, t1)
		}
		if r.APIToken == t2 {
			t.Errorf("the zombie read its successor's token %d from the API (at %s)", t2, r.At)
		}
		for _, a := range r.Attempts {
			after := a.Start.After(granted)
			if a.Target == fencedwrites.Row {
				after = a.Start.After(replaced)
			}
			switch {
			case a.Err != "":
				t.Errorf("a zombie write was not answered by fencer: %+v", a)
			case a.OK && after:
				t.Errorf("a zombie write under token %d passed after its successor's grant: %+v", a.Token, a)
			case a.OK:
				accepted++
			case after:
				refused[a.Target]++
			}
		}
	}
	for _, target := range []string{fencedwrites.Object, fencedwrites.Etcd, fencedwrites.Row} {
		if refused[target] < 5 {
			t.Errorf("the zombie's writes to the %s after its successor's were refused %d times: want at least 5, to show the zombie ran on", target, refused[target])
		}
	}
	t.Logf("the zombie: %d writes accepted in its tenure; after its successor's, refused by fencer: %v; none failed otherwise", accepted, refused)
}

// recordedToken polls the token of the member's ConfigMap's last accepted
// write until stopped.
type recordedToken struct {
	seen []int64
	stop chan struct{}
	done chan struct{}
}

func watchRecordedToken(t *testing.T, c *devcluster.Cluster, lease string) *recordedToken {
	w := &recordedToken{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for {
			cm, err := c.Client.CoreV1().ConfigMaps("default").Get(context.Background(), fencedwrites.Name(lease), metav1.GetOptions{})
			if err == nil {
				if v, err := strconv.ParseInt(cm.Annotations[fencerv1.WrittenTokenAnnotation], 10, 64); err == nil {
					w.seen = append(w.seen, v)
				}
			}
			select {
			case <-w.stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	return w
}

// check stops the watch: the recorded token never went down, and ended at
// the successor's.
func (w *recordedToken) check(t *testing.T, want int64) {
	t.Helper()
	close(w.stop)
	<-w.done
	for i := 1; i < len(w.seen); i++ {
		if w.seen[i] < w.seen[i-1] {
			t.Errorf("the ConfigMap's recorded token went down: %d, then %d", w.seen[i-1], w.seen[i])
		}
	}
	if n := len(w.seen); n == 0 || w.seen[n-1] != want {
		t.Errorf("the ConfigMap's recorded tokens %v do not end at the successor's %d", w.seen, want)
	}
}

// checkFinalState reads what the etcd key and the database row hold: the
// successor's writes, not the zombie's.
func checkFinalState(t *testing.T, as fencedwrites.Targets, s *postgres.Server, lease string, want int64) {
	t.Helper()
	ctx := context.Background()
	key := etcdkeys.DataPrefix(as.Prefix, "default") + fencedwrites.Name(lease)
	resp, err := as.Etcd.Get(ctx, key)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("the member's etcd key %s: %v", key, err)
	}
	if v := string(resp.Kvs[0].Value); !strings.HasSuffix(v, " "+strconv.FormatInt(want, 10)) {
		t.Errorf("the etcd key holds %q, not the successor's write under token %d", v, want)
	}
	var token int64
	if err := as.DB.QueryRowContext(ctx, "SELECT token FROM "+fencedwrites.Table+" WHERE lease = $1", lease).Scan(&token); err != nil {
		t.Fatal(err)
	}
	if token != want {
		t.Errorf("the database row holds token %d, not the successor's %d", token, want)
	}
}

// removeMember deletes m and its WorkloadLease, uncordons the nodes, and
// waits until the kubelet, resumed, has killed the zombie's container.
func removeMember(t *testing.T, c *devcluster.Cluster, m member, zombie *corev1.Pod) {
	ctx := context.Background()
	for _, args := range [][]string{
		{"uncordon", "kwok-node-0"}, {"uncordon", devcluster.RealNodeName},
		{"delete", strings.ToLower(m.kind), m.name, "--ignore-not-found", "--wait=false"},
		{"delete", "workloadlease", m.name, "--ignore-not-found"},
	} {
		if _, err := c.Kubectl(ctx, args...); err != nil {
			t.Errorf("kubectl %s: %v", strings.Join(args, " "), err)
		}
	}
	waitFor(t, 90*time.Second, "the zombie's container gone from the real node", func() (bool, error) {
		_, running := podProcess(zombie, "member")
		return !running, nil
	})
	// The member Lease is the WorkloadLease's: the garbage collector deletes
	// it with its parent (envtest, which runs no garbage collector, checks
	// only the owner reference).
	waitFor(t, 60*time.Second, "member Lease "+m.lease()+" deleted with its WorkloadLease", func() (bool, error) {
		_, err := c.Kubectl(ctx, "get", "flease", m.lease())
		return err != nil && strings.Contains(err.Error(), "NotFound"), nil
	})
}
