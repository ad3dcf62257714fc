// Package machinelock serialises test processes on one machine with a
// lock file: the suites .ci/run starts side by side share apt-get and the
// loopback ports, and each takes its turn here.
package machinelock

import (
	"context"
	"fmt"
	"os"
	"syscall"
)

// Take takes the exclusive flock of path, creating the file, and waits for
// another process holding it (or for ctx). The lock goes with the process
// if it dies. what names the lock in errors.
func Take(ctx context.Context, path, what string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	locked := make(chan error, 1)
	go func() { locked <- syscall.Flock(int(f.Fd()), syscall.LOCK_EX) }()
	select {
	case err := <-locked:
		if err != nil {
			_ = f.Close()
			return nil, fmt.Errorf("%s: locking %s: %w", what, path, err)
		}
		return func() { _ = f.Close() }, nil // closing the file releases the lock
	case <-ctx.Done():
		// The Flock goroutine still waits on f: whether it then takes the
		// lock or fails, closing f lets the lock go.
		release := func(error) { _ = f.Close() }
		go func() { release(<-locked) }()
		return nil, fmt.Errorf("%s: waiting for another process holding %s: %w", what, path, ctx.Err())
	}
}
