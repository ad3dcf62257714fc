// Package manager runs the real fencer binary against envtest and an etcd it
// can stop, to test what an operator sees: probes, flags and exit codes.
package manager

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/fencer-io/fencer/test/support/devcluster"
	"github.com/fencer-io/fencer/test/support/framework"
	"github.com/fencer-io/fencer/test/support/testenv"
)

var (
	env        *envtest.Environment
	kubeconfig string
	fencerBin  string
	binDir     string
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	var err error
	if binDir, err = testenv.BinDir(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	tmp, err := os.MkdirTemp("", "fencer-manager-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(tmp)
	if fencerBin, err = buildFencer(tmp); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if env, err = testenv.New(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if _, err := env.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "starting envtest:", err)
		return 1
	}
	defer func() { _ = env.Stop() }()
	admin, err := env.AddUser(envtest.User{Name: "admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	raw, err := admin.KubeConfig()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	kubeconfig = filepath.Join(tmp, "kubeconfig")
	if err := os.WriteFile(kubeconfig, raw, 0o600); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

func buildFencer(dir string) (string, error) {
	root, err := testenv.RepoRoot()
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, "fencer")
	cmd := exec.Command("go", "build", "-o", out, "./cmd/fencer")
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building fencer: %w\n%s", err, b)
	}
	return out, nil
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// replica is one fencer manager process, killed when the test ends.
type replica struct {
	cmd      *exec.Cmd
	log      string
	probeURL string
}

// startFencer runs the manager binary against envtest with args added.
func startFencer(t *testing.T, name string, args ...string) *replica {
	t.Helper()
	probe := freePort(t)
	r := &replica{
		log:      filepath.Join(t.TempDir(), name+".log"),
		probeURL: fmt.Sprintf("http://127.0.0.1:%d", probe),
	}
	r.cmd = exec.Command(fencerBin, append([]string{
		"--kubeconfig=" + kubeconfig,
		"--metrics-bind-address=0",
		"--webhook-port=0",
		fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", probe),
	}, args...)...)
	log, err := os.Create(r.log)
	if err != nil {
		t.Fatal(err)
	}
	r.cmd.Stdout, r.cmd.Stderr = log, log
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = r.cmd.Process.Kill()
		_ = r.cmd.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(r.log)
			t.Logf("%s log:\n%s", name, b)
		}
	})
	return r
}

// waitStatus polls url until it answers want, or fails after 60s.
func waitStatus(t *testing.T, url string, want int) {
	t.Helper()
	if err := framework.WaitHTTP(context.Background(), url, want, 60*time.Second); err != nil {
		t.Fatal(err)
	}
}

// TestReadinessFollowsEtcd: /readyz fails while etcd is down and passes again
// once it is back, while /healthz keeps passing (the process is fine).
func TestReadinessFollowsEtcd(t *testing.T) {
	etcd, err := devcluster.NewEtcd(binDir, t.TempDir(), "fencer-etcd")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := etcd.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = etcd.Stop() })

	probe := startFencer(t, "fencer", "--leader-elect=false", "--etcd-endpoints="+etcd.Endpoint, "--etcd-probe-timeout=500ms").probeURL
	waitStatus(t, probe+"/readyz", http.StatusOK)

	if err := etcd.Stop(); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, probe+"/readyz", http.StatusInternalServerError)
	waitStatus(t, probe+"/healthz", http.StatusOK)

	if err := etcd.Start(ctx); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, probe+"/readyz", http.StatusOK)
}

// TestStartsWithoutEtcd: the manager starts, unready, when etcd is not yet up.
func TestStartsWithoutEtcd(t *testing.T) {
	probe := startFencer(t, "fencer", "--leader-elect=false", fmt.Sprintf("--etcd-endpoints=http://127.0.0.1:%d", freePort(t)), "--etcd-probe-timeout=300ms").probeURL
	waitStatus(t, probe+"/healthz", http.StatusOK)
	waitStatus(t, probe+"/readyz", http.StatusInternalServerError)
}

// TestBadFlagsExitWithAMessage: a misconfiguration stops the binary at once
// with exit code 2 and a message naming the flag.
func TestBadFlagsExitWithAMessage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{}, "fencer: --etcd-endpoints is required"},
		{[]string{"--etcd-endpoints=127.0.0.1:2379"}, `fencer: --etcd-endpoints: "127.0.0.1:2379" must start with http:// or https://`},
		{[]string{"--etcd-endpoints=https://e:1", "--etcd-ca-file=/nonexistent/ca.pem"}, "etcd client TLS"},
	} {
		out, err := exec.Command(fencerBin, tc.args...).CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) {
			t.Fatalf("fencer %v: want a non-zero exit, got %v", tc.args, err)
		}
		if !strings.Contains(string(out), tc.want) {
			t.Errorf("fencer %v printed %q, want %q", tc.args, out, tc.want)
		}
	}
}

// TestRefusesEndpointsOfTwoEtcdClusters: a manager given the endpoints of
// two etcd clusters (members added by scaling the bundled etcd's
// StatefulSet bootstrap a cluster of their own) would grant in both, so it
// refuses to start, naming both.
func TestRefusesEndpointsOfTwoEtcdClusters(t *testing.T) {
	a, b := testenv.Etcd(t), testenv.Etcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, fencerBin, "--kubeconfig="+kubeconfig, "--metrics-bind-address=0", "--webhook-port=0",
		"--health-probe-bind-address=0", "--leader-elect=false", "--etcd-endpoints="+a+","+b).CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || ctx.Err() != nil {
		t.Fatalf("fencer over two etcd clusters: want it to exit at start, got %v\n%s", err, out)
	}
	for _, want := range []string{"etcd endpoints belong to different clusters", a, b} {
		if !strings.Contains(string(out), want) {
			t.Errorf("its message does not name %q:\n%s", want, out)
		}
	}
}
