package fence

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencer-io/fencer/pkg/etcdkeys"
	"github.com/fencer-io/fencer/test/support/testenv"
)

// A prefix no fencer install can have (the manager refuses it as
// --etcd-prefix) is refused before any etcd call: the SDK used to read and
// write keys no install uses, which etcd auth refuses but an etcd without
// auth takes, silently.
func TestAPrefixNoInstallHasIsMisconfigured(t *testing.T) {
	cli := testenv.OfflineClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, prefix := range []string{"fencer", "/fencer/", "/a:b"} {
		if _, err := NewLocker(cli, prefix, "ns", LockerOptions{}); !errors.Is(err, etcdkeys.ErrBadPrefix) {
			t.Errorf("NewLocker with prefix %q: %v, want ErrBadPrefix", prefix, err)
		}
		for name, tok := range map[string]EtcdFence{"a Lease token": Token{Lease: "l", Value: 5, LeaseID: 1}, "a lock token": LockToken{Key: "k", Value: 5, Waiter: "w"}} {
			if _, err := NewTxn(cli, prefix, "ns", tok).Commit(ctx); !errors.Is(err, ErrMisconfigured) || !errors.Is(err, etcdkeys.ErrBadPrefix) {
				t.Errorf("NewTxn for %s with prefix %q: %v, want ErrMisconfigured and ErrBadPrefix", name, prefix, err)
			}
		}
		if _, err := Hold(ctx, cli, prefix, "ns", Token{Lease: "l", Value: 5, LeaseID: 1}); !errors.Is(err, ErrMisconfigured) {
			t.Errorf("Hold with prefix %q: %v, want ErrMisconfigured", prefix, err)
		}
	}
}
