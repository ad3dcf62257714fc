// Package postgres runs a real PostgreSQL server for a test: Debian's
// postgresql package (installed with apt-get when missing), initialized
// and run as the unprivileged postgres user on a unix socket in a
// temporary directory, with no TCP listener, and torn down when the test
// ends. Run starts one for a demo. Tests use it only under `make test-db`
// (FENCER_TEST_DB=1), which needs
// root, to install the package and to run as postgres: `make test`
// downloads nothing, and skips these tests with a message naming the
// target.
package postgres

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"testing"
	"time"

	// The tests' driver; the SDK itself takes any database/sql driver.
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/fencer-io/fencer/test/support/debian"
)

// Server is a running PostgreSQL.
type Server struct {
	// Dir is the socket directory; DSN connects to database postgres.
	Dir, DSN string
	bin      string
	started  bool
}

// Start runs a server for t, or skips t without FENCER_TEST_DB; it is
// stopped when t ends.
func Start(t testing.TB) *Server {
	t.Helper()
	if os.Getenv("FENCER_TEST_DB") == "" {
		t.Skip("needs a real PostgreSQL: run `make test-db` (as root; it installs Debian's postgresql when missing)")
	}
	s, err := Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Stop() })
	return s
}

// ErrNotRoot: installing Debian's package and running the server as the
// postgres user need root.
var ErrNotRoot = errors.New("running PostgreSQL needs root, to install Debian's postgresql when missing and to run it as the postgres user")

// Run starts a server in a new temporary directory, for a test or a demo;
// Stop it.
func Run(ctx context.Context) (_ *Server, err error) {
	if os.Geteuid() != 0 {
		return nil, ErrNotRoot
	}
	bin, err := binDir(ctx)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "fencer-pg-")
	if err != nil {
		return nil, err
	}
	s := &Server{Dir: dir, DSN: fmt.Sprintf("host=%s user=postgres dbname=postgres sslmode=disable", dir), bin: bin}
	defer func() {
		if err != nil {
			_ = s.Stop()
		}
	}()
	if out, err := exec.Command("chown", "postgres:postgres", dir).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("chown %s: %w\n%s", dir, err, out)
	}
	if err := s.asPostgres("initdb", "-A", "trust", "-U", "postgres", "-D", s.data()); err != nil {
		return nil, err
	}
	opts := fmt.Sprintf("-k %s -c listen_addresses= -c fsync=on -c synchronous_commit=on", dir)
	if err := s.asPostgres("pg_ctl", "start", "-w", "-D", s.data(), "-l", filepath.Join(dir, "log"), "-o", opts); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "log"))
		return nil, fmt.Errorf("%w\n%s", err, log)
	}
	s.started = true
	db, err := sql.Open("pgx", s.DSN)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := db.PingContext(pctx); err != nil {
		return nil, fmt.Errorf("the first query: %w", err)
	}
	return s, nil
}

// Stop stops the server and removes its directory.
func (s *Server) Stop() error {
	var err error
	if s.started {
		err = s.asPostgres("pg_ctl", "stop", "-m", "fast", "-D", s.data())
	}
	return errors.Join(err, os.RemoveAll(s.Dir))
}

func (s *Server) data() string { return filepath.Join(s.Dir, "data") }

// asPostgres runs one of the server's programs as the postgres user.
func (s *Server) asPostgres(name string, args ...string) error {
	cmd := exec.Command("runuser", append([]string{"-u", "postgres", "--", filepath.Join(s.bin, name)}, args...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %w\n%s", name, err, out)
	}
	return nil
}

// Open is a connection pool to the server, closed when t ends.
func (s *Server) Open(t testing.TB) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", s.DSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// binDir is the newest installed PostgreSQL's bin directory, installing
// Debian's postgresql package when none is.
func binDir(ctx context.Context) (string, error) {
	find := func() string {
		dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
		sort.Strings(dirs)
		if len(dirs) == 0 {
			return ""
		}
		return filepath.Dir(dirs[len(dirs)-1])
	}
	if d := find(); d != "" {
		return d, nil
	}
	if err := debian.Install(ctx, "postgresql"); err != nil {
		return "", err
	}
	if d := find(); d != "" {
		return d, nil
	}
	return "", fmt.Errorf("postgresql installed, but no /usr/lib/postgresql/*/bin/initdb")
}
