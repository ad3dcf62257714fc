package smoke

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Stories are the runnable examples under examples/: each plays its
// problem without fencer, then with it, and prints one RESULT line per run.
var stories = []string{"scheduled-job", "index-publisher", "attempt-ids", "unique-ids", "directory-moves", "statefulset-zombie"}

// needsDatabase are the stories that run PostgreSQL: they play only under
// `make test-db` (root), which runs this test for them alone.
var needsDatabase = map[string]bool{"directory-moves": true}

// runStories runs each story's demo against the dev cluster, as `make demo
// STORY=<name>` does, and checks that the unfenced run shows the anomaly
// and the fenced run none.
func runStories(t *testing.T, root, kubeconfig string) {
	for _, name := range stories {
		t.Run(name, func(t *testing.T) {
			if needsDatabase[name] && os.Getenv("FENCER_TEST_DB") == "" {
				t.Skipf("%s runs PostgreSQL: `make test-db` (as root) plays it", name)
			}
			bin := filepath.Join(t.TempDir(), name)
			build := exec.Command("go", "build", "-o", bin, "./examples/"+name)
			build.Dir = root
			if out, err := build.CombinedOutput(); err != nil {
				t.Fatalf("building %s: %v\n%s", name, err, out)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			demo := exec.CommandContext(ctx, bin, "demo")
			demo.Dir = root
			demo.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig, "STORY_DIR="+filepath.Join(root, "examples", name))
			raw, err := demo.CombinedOutput()
			out := string(raw)
			if err != nil {
				t.Fatalf("%s demo: %v\n%s", name, err, out)
			}
			if !strings.Contains(out, "RESULT without fencer: ANOMALY") {
				t.Errorf("%s: the run without fencer shows no anomaly:\n%s", name, out)
			}
			if !strings.Contains(out, "RESULT with fencer: no anomaly") {
				t.Errorf("%s: the run with fencer is not clean:\n%s", name, out)
			}
			t.Logf("%s:\n%s", name, out)
		})
	}
}
