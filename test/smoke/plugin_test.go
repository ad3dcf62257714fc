package smoke

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/fencer-io/fencer/pkg/etcdkeys"
	"github.com/fencer-io/fencer/pkg/fence"
)

// updateGolden rewrites the golden files instead of comparing with them.
var updateGolden = os.Getenv("FENCER_UPDATE_GOLDEN") != ""

const pluginObjects = `apiVersion: v1
kind: Namespace
metadata: {name: plugin}
---
apiVersion: fencer.io/v1alpha1
kind: IDRange
metadata: {name: orders, namespace: plugin}
spec: {mode: Blocks, min: 1, max: 1000000000, blockSize: 1000, podSelector: {matchLabels: {app: w}}}
---
apiVersion: fencer.io/v1alpha1
kind: IDRange
metadata: {name: workers, namespace: plugin}
spec: {mode: Slots, min: 0, max: 1023, slotTTLSeconds: 15, podSelector: {matchLabels: {app: w}}}
`

// pluginLease is created once every pod is Ready, so that its first holder
// is the one the golden files name (the oldest Ready pod, then by name:
// w-0), whatever order kwok makes the pods Ready in.
const pluginLease = `apiVersion: fencer.io/v1alpha1
kind: Lease
metadata: {name: job, namespace: plugin}
spec: {ttlSeconds: 10, holderSelector: {matchLabels: {app: w}}}
`

// runPlugin runs kubectl-fencer's five commands through the real kubectl
// (as a plugin on PATH) against the dev cluster, and compares their output
// with testdata/plugin/*.golden. Tokens, blocks, slots, times and ages vary
// from run to run and are replaced by placeholders first.
func runPlugin(t *testing.T, root, bin, kubeconfig string, kubectl func(...string) string, apply func(name, manifest string)) {
	dir := t.TempDir()
	build := exec.Command("go", "build", "-o", filepath.Join(dir, "kubectl-fencer"), "./cmd/kubectl-fencer")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the plugin: %v\n%s", err, out)
	}
	objects := pluginObjects
	for i := range 3 {
		objects += fmt.Sprintf("---\napiVersion: v1\nkind: Pod\nmetadata: {name: w-%d, namespace: plugin, labels: {app: w}}\nspec: {containers: [{name: c, image: registry.k8s.io/pause:3.10}]}\n", i)
	}
	apply("plugin.yaml", objects)
	kubectl("wait", "--for=condition=Ready", "pod", "--all", "-n", "plugin", "--timeout=60s")
	apply("plugin-lease.yaml", pluginLease)
	kubectl("wait", "--for=condition=Ready", "flease/job", "-n", "plugin", "--timeout=60s")
	var token int64
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		ann := kubectl("get", "pods", "-n", "plugin", "-o", `jsonpath={range .items[*]}{.metadata.annotations.idrange\.fencer\.io/orders}{.metadata.annotations.idrange\.fencer\.io/workers}{"\n"}{end}`)
		token, _ = strconv.ParseInt(kubectl("get", "flease", "job", "-n", "plugin", "-o", "jsonpath={.status.token}"), 10, 64)
		if strings.Count(ann, "block=") == 3 && strings.Count(ann, "slot=") == 3 && token > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the plugin namespace's IDRanges did not annotate every pod: %q", ann)
		}
	}
	apply("out.yaml", fmt.Sprintf("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: out, namespace: plugin, labels: {fencer.io/lease: job}, annotations: {fencer.io/token: %q}}\ndata: {v: '1'}\n", strconv.FormatInt(token, 10)))

	// pluginExits runs the plugin and wants exit status code: check exits
	// 1 for a refusal, after printing the decision and nothing on stderr.
	pluginExits := func(code int, golden string, args ...string) {
		t.Helper()
		cmd := exec.Command(filepath.Join(bin, "kubectl"), append([]string{"fencer", "--kubeconfig", kubeconfig, "-n", "plugin"}, args...)...)
		cmd.Env = append(os.Environ(), "PATH="+dir+string(os.PathListSeparator)+os.Getenv("PATH"))
		var stderr strings.Builder
		cmd.Stderr = &stderr
		raw, err := cmd.Output()
		if got := cmd.ProcessState.ExitCode(); got != code || stderr.Len() > 0 {
			t.Fatalf("kubectl fencer %v: exit status %d, want %d (%v)\nstdout:\n%s\nstderr:\n%s", args, got, code, err, raw, stderr.String())
		}
		got := normalize(string(raw), token)
		if args[0] == "locks" {
			got = lockTokens.ReplaceAllString(got, "${1}<rev>")
		}
		path := filepath.Join(root, "test", "smoke", "testdata", "plugin", golden)
		if updateGolden {
			if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
				t.Fatal(err)
			}
			return
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (FENCER_UPDATE_GOLDEN=1 writes it)", err)
		}
		if got != string(want) {
			t.Errorf("kubectl fencer %s:\n%s\nwant (%s):\n%s", strings.Join(args, " "), got, path, want)
		}
	}
	plugin := func(golden string, args ...string) {
		t.Helper()
		pluginExits(0, golden, args...)
	}
	plugin("status.golden", "status")
	plugin("status-job.golden", "status", "job")
	plugin("status-job-json.golden", "status", "job", "-o", "json")
	plugin("status-none-json.golden", "status", "-n", "kube-public", "-o", "json") // no Leases there: [], not null
	plugin("history.golden", "history", "job")
	plugin("check-allowed.golden", "check", "cm/out", "--token", strconv.FormatInt(token, 10))
	pluginExits(1, "check-stale.golden", "check", "configmap", "out", "--token", strconv.FormatInt(token-1, 10))
	pluginExits(1, "check-none.golden", "check", "cm/out")
	plugin("ids-blocks.golden", "ids", "orders")
	plugin("ids-slots.golden", "ids", "workers")

	release := holdLocks(t, kubectl)
	defer release()
	plugin("locks.golden", "locks")
	plugin("locks-prefix-json.golden", "locks", "dir/", "-o", "json")
	plugin("locks-all.golden", "locks", "-A")

	// A fencer.io/lease label on fencer's own kind fences nothing: the
	// label is taken, and check says so.
	kubectl("label", "flease", "job", "-n", "plugin", "fencer.io/lease=job")
	plugin("check-own-kind.golden", "check", "flease/job")
}

// holdLocks takes keyed locks in the plugin namespace as two pods would,
// with the namespace's etcd credentials: w-0 holds dir/a and the set
// {dir/b, tree}; w-1 queues for dir/a. release unlocks them all.
func holdLocks(t *testing.T, kubectl func(...string) string) (release func()) {
	t.Helper()
	dir := t.TempDir()
	for _, k := range []string{"ca.crt", "tls.crt", "tls.key", "endpoints", "prefix"} {
		raw, err := base64.StdEncoding.DecodeString(kubectl("get", "secret", "fencer-etcd-client", "-n", "plugin", "-o", "jsonpath={.data."+strings.ReplaceAll(k, ".", `\.`)+"}"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, k), raw, 0o600); err != nil {
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
	ctx := context.Background()
	lockers := map[string]*fence.Locker{}
	for _, pod := range []string{"w-0", "w-1"} {
		l, err := fence.NewLocker(cli, access.Prefix, "plugin", fence.LockerOptions{Pod: pod, PodUID: "uid-" + pod})
		if err != nil {
			t.Fatal(err)
		}
		lockers[pod] = l
	}
	var held []*fence.Lock
	for _, set := range [][]string{{"dir/a"}, {"dir/b", "tree"}} {
		lk, err := lockers["w-0"].Lock(ctx, set...)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, lk)
	}
	queued := make(chan *fence.Lock, 1)
	go func() {
		lk, err := lockers["w-1"].Lock(ctx, "dir/a")
		if err == nil {
			queued <- lk
		}
	}()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		resp, err := cli.Get(ctx, etcdkeys.LockPrefix(access.Prefix, "plugin", "dir/a"), clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err == nil && resp.Count == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("w-1 did not queue for dir/a")
		}
	}
	return func() {
		for _, lk := range held {
			_ = lk.Unlock(ctx)
		}
		if lk := <-queued; lk != nil {
			_ = lk.Unlock(ctx)
		}
		for _, l := range lockers {
			_ = l.Close(ctx)
		}
		_ = cli.Close()
	}
}

var (
	timestamps = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z`)
	ttlField   = regexp.MustCompile(`("ttlSeconds": )(\d+)`)
	keptTTL    = regexp.MustCompile(`("ttlSeconds": )ttl(\d+)`)
	ages       = regexp.MustCompile(`\b-?\d+(d|h\d+m|m\d+s|s)\b`)
	blocks     = regexp.MustCompile(`\b\d+-\d+\b`)
	slotRows   = regexp.MustCompile(`(?m)^(w-\d\s+\w+\s+)\d+(\s+)\d+$`)
	bigNumbers = regexp.MustCompile(`\b(Next:|Remaining:|Slots in use:)(\s+)\d+`)
	renewed    = regexp.MustCompile(`renewed by (fencer|the holder) \(TTL <age>\)`)
	padding    = regexp.MustCompile(`[ \t]{2,}`)
	// A keyed lock's token is the etcd revision it queued at.
	lockTokens = regexp.MustCompile(`(?m)(^(?:plugin\s+)?\S+\s+|"token": )\d+`)
)

// normalize replaces what varies from run to run with placeholders. The
// token is replaced where it stands alone; the stale token (token-1) too.
func normalize(s string, token int64) string {
	s = timestamps.ReplaceAllString(s, "<time>")
	s = blocks.ReplaceAllString(s, "<block>")
	s = slotRows.ReplaceAllString(s, "${1}<slot>${2}<token>")
	s = bigNumbers.ReplaceAllString(s, "$1$2<n>")
	// A token may equal the Lease's TTL (a revision as low as 10, when
	// this subtest runs alone): keep the TTL out of the token's way.
	s = ttlField.ReplaceAllString(s, "${1}ttl${2}")
	for _, tok := range []int64{token, token - 1} {
		name := "<token>"
		if tok != token {
			name = "<token-1>"
		}
		s = regexp.MustCompile(`(^|[^\w.-])`+strconv.FormatInt(tok, 10)+`($|[^\w.-])`).ReplaceAllString(s, "${1}"+name+"${2}")
		s = regexp.MustCompile(`(^|[^\w.-])`+strconv.FormatInt(tok, 10)+`($|[^\w.-])`).ReplaceAllString(s, "${1}"+name+"${2}")
	}
	s = keptTTL.ReplaceAllString(s, "${1}${2}")
	s = ages.ReplaceAllString(s, "<age>")
	// Past the expireTime the status last recorded, the grant lives on
	// renewals: which of the two shows depends on when the test runs.
	s = renewed.ReplaceAllString(s, "<age>")
	// Placeholders are not as wide as what they replace: columns are
	// compared, not their padding.
	return padding.ReplaceAllString(s, "  ")
}
