package machinelock

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"
)

// The lock is held by one caller at a time; a caller that gives up
// waiting gets its context's error, and does not keep the lock once it
// would have been taken.
func TestTakeIsExclusive(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lock")
	unlock, err := Take(context.Background(), path, "test lock")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := Take(ctx, path, "test lock"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a second caller took the held lock: %v", err)
	}
	unlock()

	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	unlock, err = Take(ctx, path, "test lock")
	if err != nil {
		t.Fatalf("the lock was not released (the abandoned waiter kept it?): %v", err)
	}
	unlock()
}
