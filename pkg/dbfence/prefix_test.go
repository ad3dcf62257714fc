package dbfence

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/fencer-io/fencer/pkg/etcdkeys"
)

// InstallOf names an install by its prefix: one no install can have is
// refused before any etcd call, not taken as a name.
func TestInstallOfRefusesAPrefixNoInstallHas(t *testing.T) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"http://127.0.0.1:1"}, DialTimeout: time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	for _, prefix := range []string{"fencer", "/fencer/", "/a:b"} {
		if _, err := InstallOf(context.Background(), cli, prefix); !errors.Is(err, etcdkeys.ErrBadPrefix) {
			t.Errorf("InstallOf with prefix %q: %v, want ErrBadPrefix", prefix, err)
		}
	}
}

// A nil etcd client or database is an error naming it, not a panic.
func TestNilInputsAreNamed(t *testing.T) {
	if _, err := InstallOf(context.Background(), nil, ""); err == nil {
		t.Error("InstallOf with no etcd client: no error")
	}
	if err := (Table{}).Claim(context.Background(), nil, Lease("i", "ns", "job"), 5); err == nil {
		t.Error("Claim with no database: no error")
	}
}
