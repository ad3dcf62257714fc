package devcluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"sigs.k8s.io/yaml"
)

// KwokStages returns the Stage files of kwok's "fast" profile (nodes become
// Ready and heartbeat, pods become Ready at once and are deleted promptly),
// read from the kwok module in the Go module cache. toolsDir is hack/tools,
// whose go.mod pins the kwok version, so the stages always match the binary.
func KwokStages(ctx context.Context, toolsDir string) ([]string, error) {
	cmd := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/kwok")
	cmd.Dir = toolsDir
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("locating the kwok module (go list -m sigs.k8s.io/kwok in %s): %w; run `make tools` first", toolsDir, err)
	}
	dir := strings.TrimSpace(string(out))
	if dir == "" {
		return nil, fmt.Errorf("kwok module is not in the module cache; run `make tools` first")
	}
	return kustomizeFiles(filepath.Join(dir, "kustomize", "stage", "fast"))
}

// kustomizeFiles lists the YAML files a kustomization's resources name,
// following directories that hold kustomizations of their own. kwok's stage
// kustomizations use nothing beyond plain resources, which is all this reads.
func kustomizeFiles(dir string) ([]string, error) {
	raw, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		return nil, err
	}
	var k struct {
		Resources []string `json:"resources"`
	}
	if err := yaml.Unmarshal(raw, &k); err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	var files []string
	for _, r := range k.Resources {
		path := filepath.Join(dir, r)
		info, err := os.Stat(path)
		if err != nil {
			return nil, err
		}
		if !info.IsDir() {
			files = append(files, path)
			continue
		}
		sub, err := kustomizeFiles(path)
		if err != nil {
			return nil, err
		}
		files = append(files, sub...)
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("%s lists no stage files", dir)
	}
	return files, nil
}

// KeepRunningAnnotation keeps a kwok pod Running: kwok completes a Job's
// pods the moment they run, and a test that needs a Job pod to hold its
// member's Lease (the real node's partition test) annotates the Job's pod
// template with it.
const KeepRunningAnnotation = "fencer.test/kwok-keep-running"

// keepRunningStages copies kwok's stages to dir, with pod-complete
// skipping pods annotated KeepRunningAnnotation.
func keepRunningStages(files []string, dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var out []string
	for _, f := range files {
		if filepath.Base(f) != "pod-complete.yaml" {
			out = append(out, f)
			continue
		}
		raw, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		var stage map[string]any
		if err := yaml.Unmarshal(raw, &stage); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		spec, _ := stage["spec"].(map[string]any)
		sel, _ := spec["selector"].(map[string]any)
		exprs, ok := sel["matchExpressions"].([]any)
		if !ok {
			return nil, fmt.Errorf("%s: no spec.selector.matchExpressions to add to; has kwok's pod-complete stage changed?", f)
		}
		sel["matchExpressions"] = append(exprs, map[string]any{
			"key":      fmt.Sprintf(".metadata.annotations[%q]", KeepRunningAnnotation),
			"operator": "DoesNotExist",
		})
		patched, err := yaml.Marshal(stage)
		if err != nil {
			return nil, err
		}
		path := filepath.Join(dir, "pod-complete.yaml")
		if err := os.WriteFile(path, patched, 0o644); err != nil {
			return nil, err
		}
		out = append(out, path)
	}
	return out, nil
}
