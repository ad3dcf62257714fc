package debian

import (
	"context"
	"errors"
	"testing"
	"time"
)

// The install lock is held by one caller at a time; a caller that gives up
// waiting gets its context's error, and does not keep the lock once it
// would have been taken.
func TestInstallLockIsExclusive(t *testing.T) {
	unlock, err := lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := lock(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a second install took the held lock: %v", err)
	}
	unlock()

	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	unlock, err = lock(ctx)
	if err != nil {
		t.Fatalf("the lock was not released (the abandoned waiter kept it?): %v", err)
	}
	unlock()
}

func TestInstallingNothingNeedsNoRoot(t *testing.T) {
	if err := Install(context.Background()); err != nil {
		t.Fatalf("no packages: %v", err)
	}
	if missing := Missing(map[string]string{"go": "/proc/self/exe", "absent": "/nonexistent/fencer"}); len(missing) != 1 || missing[0] != "absent" {
		t.Fatalf("Missing = %v, want [absent]", missing)
	}
}
