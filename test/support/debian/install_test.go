package debian

import (
	"context"
	"testing"
)

func TestInstallingNothingNeedsNoRoot(t *testing.T) {
	if err := Install(context.Background()); err != nil {
		t.Fatalf("no packages: %v", err)
	}
	if missing := Missing(map[string]string{"go": "/proc/self/exe", "absent": "/nonexistent/fencer"}); len(missing) != 1 || missing[0] != "absent" {
		t.Fatalf("Missing = %v, want [absent]", missing)
	}
}
