package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fencer-io/fencer/internal/identity"
)

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
