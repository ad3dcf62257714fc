package devcluster

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"time"
)

// Etcd is a single-member etcd server on loopback that can be stopped and
// started again on the same ports and data, as a restarted member would be.
type Etcd struct {
	// Endpoint is the client URL.
	Endpoint string
	bin      string
	dir      string
	name     string
	peer     string
	proc     *proc
}

// NewEtcd prepares an etcd named name whose data and log live below dir.
// binDir holds the etcd binary.
func NewEtcd(binDir, dir, name string) (*Etcd, error) {
	ports, err := freePorts(2)
	if err != nil {
		return nil, err
	}
	return &Etcd{
		Endpoint: fmt.Sprintf("http://127.0.0.1:%d", ports[0]),
		peer:     fmt.Sprintf("http://127.0.0.1:%d", ports[1]),
		bin:      filepath.Join(binDir, "etcd"),
		dir:      dir,
		name:     name,
	}, nil
}

// Start runs the server and waits until it answers /health.
func (e *Etcd) Start(ctx context.Context) error {
	p, err := startProc(e.dir, e.name, e.bin,
		"--name="+e.name,
		"--data-dir="+filepath.Join(e.dir, e.name+".data"),
		"--listen-client-urls="+e.Endpoint,
		"--advertise-client-urls="+e.Endpoint,
		"--listen-peer-urls="+e.peer,
		"--initial-advertise-peer-urls="+e.peer,
		"--initial-cluster="+e.name+"="+e.peer,
		// Test and dev clusters are thrown away: fsync buys nothing and costs seconds.
		"--unsafe-no-fsync",
		"--log-level=warn",
	)
	if err != nil {
		return err
	}
	e.proc = p
	return waitHTTP(ctx, p, http.DefaultClient, e.Endpoint+"/health", 30*time.Second)
}

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
