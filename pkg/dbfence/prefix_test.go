package dbfence

import (
	"context"
	"errors"
	"testing"

	"github.com/fencer-io/fencer/pkg/etcdkeys"
	"github.com/fencer-io/fencer/test/support/testenv"
)

// InstallOf names an install by its prefix: one no install can have is
// refused before any etcd call, not taken as a name.
func TestInstallOfRefusesAPrefixNoInstallHas(t *testing.T) {
	cli := testenv.OfflineClient(t)
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
