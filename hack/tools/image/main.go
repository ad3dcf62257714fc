// Command image writes fencer's container image as a tarball that
// `docker load`, `podman load`, `crane push` and kind/k3d importers accept,
// without a container runtime: one layer holding the static manager binary
// at /fencer, run as UID/GID 65532 (non-root) with /fencer as entrypoint and
// PATH=/, on an empty base (nothing else in the image, distroless-style).
//
//	go run . --binary ../../../bin/fencer-linux-amd64 --tag ghcr.io/fencer-io/fencer:0.1.0 --out ../../../bin/fencer-image.tar
package main

import (
	"archive/tar"
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

func main() {
	binary := flag.String("binary", "", "the static fencer binary (linux/amd64, CGO_ENABLED=0)")
	tag := flag.String("tag", "ghcr.io/fencer-io/fencer:dev", "image reference recorded in the tarball")
	out := flag.String("out", "fencer-image.tar", "tarball to write")
	entry := flag.String("entrypoint", "fencer", "name of the binary in the image, at /<name>, and its entrypoint")
	user := flag.String("user", "65532:65532", "UID:GID the image runs as")
	flag.Parse()
	if err := buildAs(*binary, *tag, *out, *entry, *user); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

// epoch makes the image reproducible: same binary, same digest.
var epoch = time.Unix(0, 0)

func build(binary, tag, out string) error {
	return buildAs(binary, tag, out, "fencer", "65532:65532")
}

// buildAs writes an image holding binary at /<entry>, its entrypoint, run
// as user: also the real node's pause image and test workloads.
func buildAs(binary, tag, out, entry, user string) error {
	bin, err := os.ReadFile(binary)
	if err != nil {
		return fmt.Errorf("reading --binary: %w", err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range []*tar.Header{
		{Name: "tmp/", Typeflag: tar.TypeDir, Mode: 01777, ModTime: epoch},
	} {
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
	}
	if err := tw.WriteHeader(&tar.Header{Name: entry, Mode: 0o555, Size: int64(len(bin)), ModTime: epoch}); err != nil {
		return err
	}
	if _, err := tw.Write(bin); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	layerTar := buf.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(layerTar)), nil })
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cfg = cfg.DeepCopy()
	cfg.Architecture, cfg.OS = "amd64", "linux"
	cfg.Created = v1.Time{Time: epoch}
	cfg.Config.User = user
	cfg.Config.Entrypoint = []string{"/" + entry}
	// Pods that name the binary as their command (etcd, kubectl) find it.
	cfg.Config.Env = []string{"PATH=/"}
	cfg.Config.Labels = map[string]string{"org.opencontainers.image.source": "https://github.com/fencer-io/fencer"}
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		return err
	}
	ref, err := name.NewTag(tag)
	if err != nil {
		return fmt.Errorf("--tag: %w", err)
	}
	return tarball.WriteToFile(out, ref, img)
}
