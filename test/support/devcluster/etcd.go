package devcluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Etcd is a single-member etcd server on loopback that can be stopped and
// started again on the same ports and data, as a restarted member would be.
type Etcd struct {
	// Endpoint is the client URL.
	Endpoint string
	// MetricsURL serves Prometheus metrics over plain HTTP, TLS or not.
	MetricsURL string
	bin        string
	dir        string
	name       string
	peer       string
	// cluster is --initial-cluster: this member alone, or all of NewEtcdCluster.
	cluster string
	proc    *proc
	// pki, when set, makes the member serve TLS and require client certificates.
	pki *EtcdPKI
	// ExtraArgs are added to etcd's flags, e.g. a small --quota-backend-bytes.
	ExtraArgs []string
	// ManagerEnablesAuth leaves turning auth on to the fencer manager
	// (--etcd-enable-auth) instead of Start, to test that it does.
	ManagerEnablesAuth bool
	// ExtraClientURLs are more addresses to serve clients on, besides
	// Endpoint: the real node's pods reach fencer's etcd on the bridge.
	ExtraClientURLs []string
}

// NewEtcd prepares an etcd named name whose data and log live below dir.
// binDir holds the etcd binary.
func NewEtcd(binDir, dir, name string) (*Etcd, error) {
	ports, err := FreePorts(3)
	if err != nil {
		return nil, err
	}
	e := &Etcd{
		Endpoint:   fmt.Sprintf("http://127.0.0.1:%d", ports[0]),
		MetricsURL: fmt.Sprintf("http://127.0.0.1:%d/metrics", ports[2]),
		peer:       fmt.Sprintf("http://127.0.0.1:%d", ports[1]),
		bin:        filepath.Join(binDir, "etcd"),
		dir:        dir,
		name:       name,
	}
	e.cluster = e.name + "=" + e.peer
	return e, nil
}

// NewEtcdCluster prepares an n-member cluster, members <name>-0 … <name>-<n-1>.
// Start the members together (StartAll): each waits for a quorum.
func NewEtcdCluster(binDir, dir, name string, n int) ([]*Etcd, error) {
	members := make([]*Etcd, n)
	var initial []string
	for i := range members {
		m, err := NewEtcd(binDir, dir, fmt.Sprintf("%s-%d", name, i))
		if err != nil {
			return nil, err
		}
		members[i] = m
		initial = append(initial, m.cluster)
	}
	for _, m := range members {
		m.cluster = strings.Join(initial, ",")
	}
	return members, nil
}

// StartAll starts members at once and waits until each answers /health,
// which needs a quorum.
func StartAll(ctx context.Context, members []*Etcd) error {
	for _, m := range members {
		if err := m.launch(); err != nil {
			return err
		}
	}
	for _, m := range members {
		if err := m.wait(ctx); err != nil {
			return err
		}
	}
	return members[0].lock(ctx)
}

// Start runs the server and waits until it answers /health.
func (e *Etcd) Start(ctx context.Context) error {
	if err := e.launch(); err != nil {
		return err
	}
	if err := e.wait(ctx); err != nil {
		return err
	}
	return e.lock(ctx)
}

// lock turns auth on for a Secure etcd, as the manager does on a fresh or
// restored-from-nothing etcd; a no-op when it is on already.
func (e *Etcd) lock(ctx context.Context) error {
	if e.pki == nil || e.ManagerEnablesAuth {
		return nil
	}
	return e.EnableAuth(ctx)
}

func (e *Etcd) launch() error {
	args := []string{
		"--name=" + e.name,
		"--data-dir=" + filepath.Join(e.dir, e.name+".data"),
		"--listen-client-urls=" + strings.Join(append([]string{e.Endpoint}, e.ExtraClientURLs...), ","),
		"--advertise-client-urls=" + e.Endpoint,
		"--listen-peer-urls=" + e.peer,
		"--initial-advertise-peer-urls=" + e.peer,
		"--initial-cluster=" + e.cluster,
		"--initial-cluster-token=" + filepath.Base(e.dir),
		"--listen-metrics-urls=" + strings.TrimSuffix(e.MetricsURL, "/metrics"),
		// Test and dev clusters are thrown away: fsync buys nothing and costs seconds.
		"--unsafe-no-fsync",
		"--log-level=warn",
	}
	if e.pki != nil {
		args = append(args, e.pki.serverArgs()...)
	}
	args = append(args, e.ExtraArgs...)
	p, err := startProc(e.dir, e.name, e.bin, args...)
	if err != nil {
		return err
	}
	e.proc = p
	return nil
}

func (e *Etcd) wait(ctx context.Context) error {
	hc, err := e.healthClient()
	if err != nil {
		return err
	}
	return waitHTTP(ctx, e.proc, hc, e.Endpoint+"/health", 30*time.Second)
}

// Kill ends the server with SIGKILL, as a crash; its data stays.
func (e *Etcd) Kill() {
	if e.proc == nil {
		return
	}
	e.proc.kill()
	e.proc = nil
}

// Running reports whether the server was started and not stopped.
func (e *Etcd) Running() bool { return e.proc != nil }

// Wipe deletes the stopped server's data, so the next Start begins at
// revision 1: what a cluster replaced, or restored from an old snapshot
// without --bump-revision, looks like to its clients.
func (e *Etcd) Wipe() error {
	if e.proc != nil {
		return fmt.Errorf("etcd %s: stop it before wiping its data", e.name)
	}
	return os.RemoveAll(filepath.Join(e.dir, e.name+".data"))
}

// Stop terminates the server; its data stays for the next Start.
func (e *Etcd) Stop() error {
	if e.proc == nil {
		return nil
	}
	err := e.proc.stop(10 * time.Second)
	e.proc = nil
	return err
}
