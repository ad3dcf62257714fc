package main

import (
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fencer-io/fencer/internal/identity"
)

func TestParseFlags(t *testing.T) {
	o, err := parseFlags([]string{"--etcd-endpoints=http://127.0.0.1:2379"})
	if err != nil {
		t.Fatal(err)
	}
	if !o.leaderElect || o.etcd.Prefix != "/fencer" || o.probeAddr != ":8081" {
		t.Fatalf("defaults: %+v", o)
	}
}

func TestParseFlagsRefusals(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{nil, "--etcd-endpoints is required"},
		{[]string{"--etcd-endpoints=http://e:1", "stray"}, `unexpected arguments ["stray"]`},
		{[]string{"--etcd-endpoints=http://e:1", "--leader-elect-renew-deadline=5s"}, "--leader-elect-renew-deadline (5s) must be less than --leader-elect-lease-duration (4s)"},
		{[]string{"--etcd-endpoints=http://e:1", "--leader-elect-retry-period=3s"}, "--leader-elect-retry-period (3s) must be less than --leader-elect-renew-deadline (3s)"},
		{[]string{"--etcd-endpoints=http://e:1", "--etcd-probe-timeout=0s"}, "--etcd-probe-timeout must be positive"},
		{[]string{"--no-such-flag"}, "flag provided but not defined: -no-such-flag"},
		{[]string{"--etcd-endpoints=http://e:1", "--etcd-server-secret=s"}, "--etcd-server-secret needs --etcd-pki-secret"},
		{[]string{"--etcd-endpoints=http://e:1", "--etcd-backup-secret=s"}, "--etcd-backup-secret needs --etcd-pki-secret"},
		{[]string{"--etcd-endpoints=http://e:1", "--etcd-credentials-secret="}, "--etcd-credentials-secret must not be empty"},
		{[]string{"--etcd-endpoints=http://e:1", "--etcd-step-down-after=-1s"}, "must not be negative"},
		{[]string{"--etcd-endpoints=http://e:1", "--etcd-enable-auth"}, "--etcd-enable-auth needs an identity with the root role"},
		{[]string{"--etcd-endpoints=http://e:1", "--etcd-prefix=/a:b"}, "must not contain ':'"},
	}
	for _, tc := range cases {
		_, err := parseFlagsQuiet(tc.args)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("parseFlags(%q) = %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
}

func TestHelpListsEveryFlag(t *testing.T) {
	var out strings.Builder
	_, err := parseFlagsTo([]string{"--help"}, &out)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("--help returned %v", err)
	}
	for _, f := range []string{"etcd-endpoints", "etcd-prefix", "etcd-ca-file", "etcd-cert-file", "etcd-key-file", "etcd-dial-timeout", "metrics-bind-address", "health-probe-bind-address", "leader-elect", "leader-elect-lease-duration", "kubeconfig", "zap-log-level"} {
		if !strings.Contains(out.String(), "-"+f) {
			t.Errorf("--help does not list --%s", f)
		}
	}
}

func parseFlagsQuiet(args []string) (*options, error) { return parseFlagsTo(args, io.Discard) }

// TestOperationsDocListsEveryFlag keeps docs/operations.md in step with the
// flags: a new flag without a row there fails.
func TestOperationsDocListsEveryFlag(t *testing.T) {
	doc, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	(&options{}).flagSet().VisitAll(func(f *flag.Flag) {
		if !strings.Contains(string(doc), "`--"+f.Name+"`") {
			t.Errorf("docs/operations.md does not document --%s", f.Name)
		}
	})
}

func TestSnapshotCommandRefusals(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--etcd-endpoints=http://e:1", "--dir=/nonexistent"}, "--dir /nonexistent must be an existing directory"},
		{[]string{"--etcd-endpoints=http://e:1", "--dir=/tmp", "--keep=0"}, "--keep must be at least 1"},
		{[]string{"--dir=/tmp"}, "--etcd-endpoints is required"},
	} {
		err := snapshotCommand(tc.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("snapshot %q = %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
}

func TestEnableAuthRefusesAForeignCommonName(t *testing.T) {
	dir := t.TempDir()
	ca, err := identity.NewCA("test", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	for cn, ok := range map[string]bool{"fencer:manager": true, "etcd-admin": false} {
		c, err := ca.Issue(identity.Request{CommonName: cn}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, cn+".crt")
		if err := os.WriteFile(path, c.CertPEM, 0o600); err != nil {
			t.Fatal(err)
		}
		err = checkManagerCN(path, "/fencer")
		if ok != (err == nil) {
			t.Errorf("CommonName %s: %v", cn, err)
		}
		if !ok && (err == nil || !strings.Contains(err.Error(), `only "fencer:manager"`)) {
			t.Errorf("CommonName %s: the error does not say which name etcd wants: %v", cn, err)
		}
	}
}
