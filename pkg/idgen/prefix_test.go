package idgen

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fencer-io/fencer/pkg/etcdkeys"
	"github.com/fencer-io/fencer/test/support/testenv"
)

// A prefix no fencer install can have is refused before any etcd call:
// Blocks allocated under keys no install uses (with etcd auth off) issued
// IDs that overlap the controller's blocks of the same IDRange.
func TestAPrefixNoInstallHasIsRefused(t *testing.T) {
	cli := testenv.OfflineClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, prefix := range []string{"fencer", "/fencer/", "/a:b"} {
		if _, err := NewBlocks(cli, BlockOptions{Prefix: prefix, Namespace: "ns", Name: "orders", Min: 1, Max: 1000, BlockSize: 10}); !errors.Is(err, etcdkeys.ErrBadPrefix) {
			t.Errorf("NewBlocks with prefix %q: %v, want ErrBadPrefix", prefix, err)
		}
		if _, err := NewSnowflake(ctx, cli, SnowflakeOptions{Prefix: prefix, Namespace: "ns", Name: "workers", Slot: 1, Token: 5, PodUID: "u"}); !errors.Is(err, etcdkeys.ErrBadPrefix) {
			t.Errorf("NewSnowflake with prefix %q: %v, want ErrBadPrefix", prefix, err)
		}
		if _, err := ConsumeBlock(ctx, cli, prefix, "ns", "orders", "block=1-10", "u"); !errors.Is(err, etcdkeys.ErrBadPrefix) {
			t.Errorf("ConsumeBlock with prefix %q: %v, want ErrBadPrefix", prefix, err)
		}
	}
}

// A nil client or an empty name is an error naming it, not a panic or a
// misleading "the slot was lost".
func TestNilAndEmptyInputsAreNamed(t *testing.T) {
	cli := testenv.OfflineClient(t)
	// The offline client answers nothing: an input let through would wait
	// on etcd, and fail here in seconds rather than at go test's timeout.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	good := SnowflakeOptions{Namespace: "ns", Name: "workers", Slot: 1, Token: 5, PodUID: "u"}
	for name, tc := range map[string]struct {
		call  func() error
		names string // what the error must name
	}{
		"ConsumeBlock with no client": {func() error { _, err := ConsumeBlock(ctx, nil, "", "ns", "r", "block=1-10", "u"); return err }, "client"},
		"NewSnowflake with no Namespace": {func() error {
			o := good
			o.Namespace = ""
			_, err := NewSnowflake(ctx, cli, o)
			return err
		}, "Namespace"},
		"NewSnowflake with no Name":  {func() error { o := good; o.Name = ""; _, err := NewSnowflake(ctx, cli, o); return err }, "Name"},
		"NewSnowflake with no Token": {func() error { o := good; o.Token = 0; _, err := NewSnowflake(ctx, cli, o); return err }, "Token"},
	} {
		func() {
			defer func() {
				if p := recover(); p != nil {
					t.Errorf("%s panicked: %v", name, p)
				}
			}()
			err := tc.call()
			if err == nil || !strings.HasPrefix(err.Error(), "idgen: ") || !strings.Contains(err.Error(), tc.names) ||
				errors.Is(err, ErrSlotLost) || errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("%s: %v, want an idgen error naming %s, made before any etcd call", name, err, tc.names)
			}
		}()
	}
}
