package realnode

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fencer-io/fencer/test/support/devcluster"
	"github.com/fencer-io/fencer/test/support/testenv"
)

// storiesAsPods runs the example stories (examples/) on the real node as
// `make dev NODE=real` and `make demo NODE=real` do: fencer's manager as a
// local process, and every pod of a story a real container of the story's
// image, frozen with SIGSTOP through its cgroup. Each story must show its
// anomaly without fencer and none with it.
func storiesAsPods(t *testing.T, c *devcluster.Cluster, root string) {
	ctx := context.Background()
	shared := filepath.Join(t.TempDir(), "shared")
	for _, name := range []string{"scheduled-job", "index-publisher", "attempt-ids", "unique-ids", "statefulset-zombie"} {
		t.Run(name, func(t *testing.T) {
			image := "fencer.example/story-" + name + ":dev"
			binary := buildImage(t, c, root, "./examples/"+name, image, "story")
			dctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
			defer cancel()
			demo := exec.CommandContext(dctx, binary, "demo")
			demo.Dir = root
			demo.Env = append(os.Environ(), "KUBECONFIG="+c.Kubeconfig, "STORY_DIR="+filepath.Join(root, "examples", name),
				"STORY_IMAGE="+image, "STORY_SHARED="+shared)
			raw, err := demo.CombinedOutput()
			out := string(raw)
			t.Logf("%s on the real node:\n%s", name, out)
			if err != nil {
				t.Fatalf("%s demo: %v", name, err)
			}
			if !strings.Contains(out, "RESULT without fencer: ANOMALY") || !strings.Contains(out, "RESULT with fencer: no anomaly") {
				t.Fatalf("%s: want an anomaly without fencer and none with it", name)
			}
			if strings.Contains(out, "could not signal") {
				t.Fatalf("%s: the demo could not signal a container's process", name)
			}
		})
	}
}

// startLocalFencer runs fencer's manager as a local process, as `make dev`
// does, with its CRDs, webhook and status guard installed.
func startLocalFencer(t *testing.T, c *devcluster.Cluster, root string) {
	ctx := context.Background()
	bin, err := testenv.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.InstallCRDs(ctx, filepath.Join(root, "config", "crd", "bases")); err != nil {
		t.Fatal(err)
	}
	if err := c.StartManager(ctx, filepath.Join(bin, "fencer")); err != nil {
		t.Fatal(err)
	}
	if err := c.InstallWebhook(ctx, filepath.Join(root, "config", "webhook", "manifests.yaml")); err != nil {
		t.Fatal(err)
	}
	if err := c.InstallPolicies(ctx, filepath.Join(root, "config", "guard", "policies.yaml")); err != nil {
		t.Fatal(err)
	}
}
