package devcluster

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/fencer-io/fencer/test/support/machinelock"
)

// reserveFor is how long a chosen port stays reserved. A free port is only
// free until someone binds it: the suites of `make test` run side by side
// (the fault run beside the database suite), each choosing ports at random
// from the same range, and a port one of them has checked and let go of
// looked free to the other until its etcd bound it; that etcd then exited
// with "address already in use". The reservation outlives any test run, so
// it also covers a server stopped and started again on its ports, as the
// fault run does with etcd members.
const reserveFor = 2 * time.Hour

// reservations is a directory with one file per reserved port, named by
// the port and dated by its modification time, shared by every test process
// of this user on the machine. Its lock file serialises the choosing.
type reservations struct {
	dir      string
	from, to int // ports in [from, to)
}

// reservationDir is per user: a directory made by root would refuse others.
func reservationDir() string {
	return filepath.Join(os.TempDir(), fmt.Sprintf("fencer-test-ports-%d", os.Getuid()))
}

// choose picks n distinct ports, each free to listen on now and not reserved
// by any process within reserveFor, and reserves them.
func (r reservations) choose(n int) ([]int, error) {
	if err := os.MkdirAll(r.dir, 0o755); err != nil {
		return nil, fmt.Errorf("test port reservations: %w", err)
	}
	unlock, err := machinelock.Take(context.Background(), filepath.Join(r.dir, "lock"), "test port reservations")
	if err != nil {
		return nil, err
	}
	defer unlock()
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for tries := 0; len(ports) < n; tries++ {
		if tries == 100*n {
			return nil, fmt.Errorf("found only %d free ports of %d in [%d, %d) after %d tries; ports chosen by test runs stay reserved for %s in %s", len(ports), n, r.from, r.to, tries, reserveFor, r.dir)
		}
		port := r.from + rand.IntN(r.to-r.from)
		if r.reserved(port) {
			continue
		}
		// Held open until all n are chosen, so the n differ.
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue // in use: try another
		}
		ls = append(ls, l)
		ports = append(ports, port)
	}
	for _, port := range ports {
		if err := r.reserve(port); err != nil {
			return nil, err
		}
	}
	return ports, nil
}

func (r reservations) path(port int) string {
	return filepath.Join(r.dir, strconv.Itoa(port))
}

// reserved reports whether port was reserved within reserveFor.
func (r reservations) reserved(port int) bool {
	info, err := os.Stat(r.path(port))
	return err == nil && time.Since(info.ModTime()) < reserveFor
}

// reserve dates port's file now, creating it if need be.
func (r reservations) reserve(port int) error {
	now := time.Now()
	err := os.Chtimes(r.path(port), now, now)
	if errors.Is(err, fs.ErrNotExist) {
		err = os.WriteFile(r.path(port), nil, 0o644)
	}
	if err != nil {
		return fmt.Errorf("reserving test port %d: %w", port, err)
	}
	return nil
}
