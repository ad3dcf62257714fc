package main

import (
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// TestCranePushAsDocumented runs the command docs/install.md gives for
// publishing the tarball, `crane push bin/fencer-image.tar <ref>`, with the
// real crane CLI on the tarball `make image` wrote, against a registry on
// loopback, and checks the registry
// then serves the same image (same digest) that the tarball holds.
func TestCranePushAsDocumented(t *testing.T) {
	tarPath := os.Getenv("FENCER_IMAGE_TAR")
	if tarPath == "" {
		t.Fatal("FENCER_IMAGE_TAR is not set: run `make test-image`, which runs `make image` first")
	}
	dir := t.TempDir()
	crane := filepath.Join(dir, "crane")
	if out, err := exec.Command("go", "build", "-o", crane, "github.com/google/go-containerregistry/cmd/crane").CombinedOutput(); err != nil {
		t.Fatalf("building crane: %v\n%s", err, out)
	}
	reg := httptest.NewServer(registry.New())
	defer reg.Close()
	ref := strings.TrimPrefix(reg.URL, "http://") + "/fencer-io/fencer:0.1.0"

	if out, err := exec.Command(crane, "push", tarPath, ref).CombinedOutput(); err != nil {
		t.Fatalf("crane push %s %s: %v\n%s", tarPath, ref, err, out)
	}
	out, err := exec.Command(crane, "digest", ref).Output()
	if err != nil {
		t.Fatalf("crane digest %s: %v", ref, err)
	}
	img, err := tarball.ImageFromPath(tarPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	want, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(out)); got != want.String() {
		t.Fatalf("the registry serves %s, the tarball holds %s", got, want)
	}
}
