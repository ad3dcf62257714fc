package fence

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencer-io/fencer/test/support/testenv"
)

// What a caller can get wrong by hand is ErrMisconfigured, named, before
// any I/O: a nil argument (each of these panicked, Watch's inside its own
// goroutine, where no caller can recover), a fence with no namespace or
// Lease name (it was a FencedError saying leases//job had no holder), and
// an annotations file that is another file (RunExclusive waited out its
// context and returned a bare deadline).
func TestNilAndEmptyInputsAreMisconfigured(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cli := testenv.OfflineClient(t)
	tok := Token{Lease: "job", Value: 5}
	notAnnotations := filepath.Join(t.TempDir(), "hostname")
	if err := os.WriteFile(notAnnotations, []byte("web-0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(context.Context, Token) error { return nil }
	for name, call := range map[string]func() error{
		"NewTxn with no token":          func() error { _, err := NewTxn(cli, "", "ns", nil).Commit(ctx); return err },
		"Compare with no token":         func() error { _, err := Compare("", "ns", nil); return err },
		"WatchHeld with no client":      func() error { return WatchHeld(ctx, nil, "/fencer/leases/ns/job", 5, 0) },
		"RunExclusive with no source":   func() error { return RunExclusive(ctx, nil, "job", 0, run) },
		"RunExclusive with no function": func() error { return RunExclusive(ctx, FileSource{Path: notAnnotations, Lease: "job"}, "job", 0, nil) },
		"Client.Create wrapping nil":    func() error { return NewClient(nil, tok).Create(ctx, &corev1.ConfigMap{}) },
		"Client.Update wrapping nil":    func() error { return NewClient(nil, tok).Update(ctx, &corev1.ConfigMap{}) },
		"Client.Patch wrapping nil": func() error {
			return NewClient(nil, tok).Patch(ctx, &corev1.ConfigMap{}, client.MergeFrom(&corev1.ConfigMap{}))
		},
		"Client.Unfence wrapping nil":        func() error { return NewClient(nil, tok).Unfence(ctx, &corev1.ConfigMap{}) },
		"a Lease fence with no namespace":    func() error { _, err := NewTxn(cli, "", "", tok).Commit(ctx); return err },
		"a Lease fence with no Lease":        func() error { _, err := NewTxn(cli, "", "ns", Token{Value: 5}).Commit(ctx); return err },
		"a lock fence with no namespace":     func() error { _, err := Compare("", "", LockToken{Key: "k", Value: 5, Waiter: "w"}); return err },
		"Hold with no namespace":             func() error { _, err := Hold(ctx, cli, "", "", Token{Lease: "job", Value: 5, LeaseID: 1}); return err },
		"a file that is no annotations file": func() error { _, err := FileSource{Path: notAnnotations, Lease: "job"}.Token(ctx); return err },
		"RunExclusive on that file":          func() error { return RunExclusive(ctx, FileSource{Path: notAnnotations, Lease: "job"}, "job", 0, run) },
	} {
		func() {
			defer func() {
				if p := recover(); p != nil {
					t.Errorf("%s panicked: %v", name, p)
				}
			}()
			if err := call(); !errors.Is(err, ErrMisconfigured) {
				t.Errorf("%s: %v, want ErrMisconfigured", name, err)
			}
		}()
	}
	wctx, wcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer wcancel()
	select {
	case _, open := <-Watch(wctx, nil, "job", 0):
		if open {
			t.Error("Watch of a nil source sent a token")
		}
	case <-wctx.Done():
		t.Error("Watch of a nil source neither closed nor sent")
	}
}
