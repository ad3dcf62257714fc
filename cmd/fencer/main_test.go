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

// A manager that cannot record etcd's revision (no namespace to put the
// ConfigMap in) keeps a floor an earlier check left until etcd passes it:
// only --etcd-revision-configmap="" asks for it to go at once.
func TestRevisionRecord(t *testing.T) {
	cases := []struct {
		args      []string
		record    string
		keepFloor bool
	}{
		{[]string{"--webhook-namespace=fencer-system"}, "fencer-system/fencer-etcd-revision", false},
		{[]string{"--webhook-namespace="}, "/", true},
		{[]string{"--webhook-namespace=", "--etcd-revision-configmap="}, "/", false},
		{[]string{"--webhook-namespace=fencer-system", "--etcd-revision-configmap="}, "/", false},
	}
	for _, tc := range cases {
		o, err := parseFlagsQuiet(append([]string{"--etcd-endpoints=http://e:1"}, tc.args...))
		if err != nil {
			t.Fatal(err)
		}
		if record, keep := revisionRecord(o); record.String() != tc.record || keep != tc.keepFloor {
			t.Errorf("%v: record %q, keepFloor %v; want %q, %v", tc.args, record.String(), keep, tc.record, tc.keepFloor)
		}
	}
}
