package main

import (
	"archive/tar"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// TestImageRunsTheManager builds the image from the real manager binary
// ($FENCER_IMAGE_BINARY, set by `make test-image`), reads it back as a
// runtime would, checks its configuration, and runs the binary it contains.
func TestImageRunsTheManager(t *testing.T) {
	binary := os.Getenv("FENCER_IMAGE_BINARY")
	if binary == "" {
		t.Fatal("FENCER_IMAGE_BINARY is not set: run `make test-image`")
	}
	dir := t.TempDir()
	out := filepath.Join(dir, "image.tar")
	if err := build(binary, "ghcr.io/fencer-io/fencer:test", out); err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(out, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Config.User != "65532:65532" || strings.Join(cfg.Config.Entrypoint, " ") != "/fencer" || cfg.OS != "linux" || cfg.Architecture != "amd64" {
		t.Fatalf("image config: user %q entrypoint %v %s/%s", cfg.Config.User, cfg.Config.Entrypoint, cfg.OS, cfg.Architecture)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers: %d %v", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	var names []string
	extracted := filepath.Join(dir, "fencer")
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		if h.Name == "fencer" {
			f, err := os.OpenFile(extracted, os.O_CREATE|os.O_WRONLY, 0o755)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.Copy(f, tr); err != nil {
				t.Fatal(err)
			}
			f.Close()
		}
	}
	if strings.Join(names, ",") != "tmp/,fencer" {
		t.Fatalf("the image holds %v; want only /tmp and /fencer", names)
	}
	help, err := exec.Command(extracted, "--help").CombinedOutput()
	if err != nil || !strings.Contains(string(help), "fencer: the fencer manager") {
		t.Fatalf("the image's binary: %v\n%s", err, help)
	}

	again := filepath.Join(dir, "again.tar")
	if err := build(binary, "ghcr.io/fencer-io/fencer:test", again); err != nil {
		t.Fatal(err)
	}
	img2, err := tarball.ImageFromPath(again, nil)
	if err != nil {
		t.Fatal(err)
	}
	d1, _ := img.Digest()
	d2, _ := img2.Digest()
	if d1 != d2 {
		t.Fatalf("two builds of one binary differ: %s %s", d1, d2)
	}
}
