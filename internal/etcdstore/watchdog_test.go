package etcdstore

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
)

func TestWatchdogStepsDownOnlyAfterTimeoutAndNotWhileDefragmenting(t *testing.T) {
	cli, err := Connect(Config{Endpoints: []string{"http://127.0.0.1:1"}, Prefix: DefaultPrefix, DialTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	paused := true
	w := &Watchdog{Cli: cli, Prefix: DefaultPrefix, ProbeTimeout: 100 * time.Millisecond, Timeout: 300 * time.Millisecond, Paused: func() bool { return paused }, Log: testr.New(t)}
	ctx := context.Background()
	for range 5 {
		if err := w.probe(ctx); err != nil {
			t.Fatalf("stepped down while a member was defragmenting: %v", err)
		}
	}
	paused = false
	if err := w.probe(ctx); err != nil {
		t.Fatalf("stepped down at the first failed probe: %v", err)
	}
	if w.Checker(nil) != nil {
		t.Error("liveness failed before the timeout")
	}
	time.Sleep(350 * time.Millisecond)
	err = w.probe(ctx)
	if err == nil || !strings.Contains(err.Error(), "giving up leadership") {
		t.Fatalf("after the timeout: %v", err)
	}
	if w.Checker(nil) == nil {
		t.Error("liveness still passes after the timeout")
	}
}
