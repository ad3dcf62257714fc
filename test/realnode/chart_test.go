package realnode

import (
	"archive/tar"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/fencer-io/fencer/test/support/devcluster"
	"github.com/fencer-io/fencer/test/support/testenv"
)

// The release the test installs, with the chart's default values.
const (
	release   = "fencer"
	releaseNS = "fencer-system"
	manager   = "deployment/fencer"
)

// chartOnRealNode installs charts/fencer with helm on the real node, as a
// user with a one-node cluster would, and runs workloads against it.
func chartOnRealNode(t *testing.T, c *devcluster.Cluster, root string) {
	k := kubectlFor(t, c)
	helm := helmFor(t, c)
	// The kwok nodes are cordoned: every pod of the release runs in a real
	// container, and the scheduler has one node, as a one-node cluster has.
	for _, n := range strings.Fields(k("get", "nodes", "-o", "name")) {
		if n != "node/"+devcluster.RealNodeName {
			k("cordon", n)
		}
	}
	importChartImages(t, c, root)
	localVolumes(t, c)

	start := time.Now()
	if out, err := helm("install", release, filepath.Join(root, "charts", "fencer"), "-n", releaseNS, "--create-namespace", "--wait", "--timeout", "5m"); err != nil {
		t.Fatalf("helm install: %v\n%s\n%s", err, out, k("get", "pods,pvc,events", "-n", releaseNS))
	}
	t.Logf("helm install --wait returned after %s; the release's pods:\n%s", time.Since(start).Round(time.Second), k("get", "pods", "-n", releaseNS, "-o", "wide"))
	if ready := k("get", manager, "-n", releaseNS, "-o", "jsonpath={.status.readyReplicas}"); ready != "2" {
		t.Fatalf("%s has %q ready replicas, want 2", manager, ready)
	}

	out, err := helm("test", release, "-n", releaseNS, "--timeout", "3m", "--logs")
	if err != nil {
		t.Fatalf("helm test with a working webhook: %v\n%s", err, out)
	}
	if !strings.Contains(out, "created (server dry run)") {
		t.Fatalf("helm test passed, but its pod's log does not show the webhook's dry run:\n%s", out)
	}
	scrapeChartMetrics(t, c)
	brokenWebhookFailsHelmTest(t, c)

	electRealWorkers(t, c, root)
	consumeIDsAcrossRestart(t, c, root)

	if out, err := helm("uninstall", release, "-n", releaseNS, "--wait", "--timeout", "3m"); err != nil {
		t.Fatalf("helm uninstall: %v\n%s", err, out)
	}
	// The CRDs, and with them every Lease and IDRange, outlive the release.
	k("get", "crd", "leases.fencer.io", "idranges.fencer.io")
	if holder := k("get", "flease", "report", "-n", "default", "-o", "jsonpath={.status.holder}"); holder == "" {
		t.Fatal("the Lease report lost its status with the release")
	}
	k("get", "idrange", "orders", "-n", "default")
}

// brokenWebhookFailsHelmTest scales the manager to zero, so the webhook
// does not answer, and expects helm test to fail for that reason; then it
// scales the manager back.
func brokenWebhookFailsHelmTest(t *testing.T, c *devcluster.Cluster) {
	k := kubectlFor(t, c)
	helm := helmFor(t, c)
	k("scale", manager, "-n", releaseNS, "--replicas=0")
	waitFor(t, 2*time.Minute, "the manager pods gone", func() (bool, error) {
		out := k("get", "pods", "-n", releaseNS, "-l", "app.kubernetes.io/component=manager", "-o", "name")
		return strings.TrimSpace(out) == "", nil
	})
	out, err := helm("test", release, "-n", releaseNS, "--timeout", "3m", "--logs")
	if err == nil {
		t.Fatalf("helm test passed with no manager to answer the webhook:\n%s", out)
	}
	if !strings.Contains(out, "failed calling webhook") {
		t.Fatalf("helm test failed, but not because the webhook did not answer: %v\n%s", err, out)
	}
	t.Logf("helm test with the manager scaled to 0: %v", err)
	k("scale", manager, "-n", releaseNS, "--replicas=2")
	k("rollout", "status", manager, "-n", releaseNS, "--timeout=3m")
}

// importChartImages puts the images the chart's default values name on the
// node: the manager from `make image`, and etcd and kubectl (the helm test
// pod's) built from bin/. The names come from the chart, so a version bump
// there cannot leave the test importing the wrong tag.
func importChartImages(t *testing.T, c *devcluster.Cluster, root string) {
	ctx := context.Background()
	bin, err := testenv.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	var values struct {
		Image struct{ Repository string } `json:"image"`
		Etcd  struct {
			Bundled struct {
				Image struct{ Repository, Tag string } `json:"image"`
			} `json:"bundled"`
		} `json:"etcd"`
	}
	var chart struct{ AppVersion string }
	readYAML(t, filepath.Join(root, "charts", "fencer", "values.yaml"), &values)
	readYAML(t, filepath.Join(root, "charts", "fencer", "Chart.yaml"), &chart)
	tarball := filepath.Join(bin, "fencer-image.tar")
	if got, want := imageTag(t, tarball), values.Image.Repository+":"+chart.AppVersion; got != want {
		t.Fatalf("%s holds %s, but the chart's default image is %s: run make image IMAGE=%s", tarball, got, want, want)
	}
	if err := c.ImportImage(ctx, tarball); err != nil {
		t.Fatal(err)
	}
	etcd := values.Etcd.Bundled.Image
	if err := c.BuildImage(ctx, filepath.Join(bin, "etcd"), etcd.Repository+":"+etcd.Tag, "etcd", "65532:65532"); err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile(filepath.Join(root, "charts", "fencer", "templates", "tests", "test-install.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	kubectl := ""
	for _, l := range strings.Split(string(tests), "\n") {
		if ref, ok := strings.CutPrefix(strings.TrimSpace(l), "image: registry.k8s.io/kubectl:"); ok {
			kubectl = "registry.k8s.io/kubectl:" + ref
		}
	}
	if kubectl == "" {
		t.Fatal("the helm test pod names no registry.k8s.io/kubectl image")
	}
	if err := c.BuildImage(ctx, filepath.Join(bin, "kubectl"), kubectl, "kubectl", "65532:65532"); err != nil {
		t.Fatal(err)
	}
}

// imageTag reads the tag a docker-format image tarball was written with.
func imageTag(t *testing.T, tarball string) string {
	t.Helper()
	f, err := os.Open(tarball)
	if err != nil {
		t.Fatalf("%v: run make image (make test-real-node does)", err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("%s: no manifest.json (%v)", tarball, err)
		}
		if h.Name != "manifest.json" {
			continue
		}
		var manifest []struct{ RepoTags []string }
		raw, err := io.ReadAll(tr)
		if err != nil || json.Unmarshal(raw, &manifest) != nil || len(manifest) != 1 || len(manifest[0].RepoTags) != 1 {
			t.Fatalf("%s: unreadable manifest.json %s", tarball, raw)
		}
		return manifest[0].RepoTags[0]
	}
}

func readYAML(t *testing.T, path string, into any) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(raw, into); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// localVolumes gives the cluster what a one-node cluster's installer
// would: a default StorageClass, here with hostPath volumes made ahead for
// the etcd member's and the backup's claims.
func localVolumes(t *testing.T, c *devcluster.Cluster) {
	ctx := context.Background()
	sc := &storagev1.StorageClass{
		ObjectMeta:  metav1.ObjectMeta{Name: "local", Annotations: map[string]string{"storageclass.kubernetes.io/is-default-class": "true"}},
		Provisioner: "kubernetes.io/no-provisioner",
	}
	if _, err := c.Client.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		dir := filepath.Join(c.RealNodeDir(), "volumes", fmt.Sprintf("pv-%d", i))
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		// The chart's pods run as 65532, and the kubelet does not apply
		// fsGroup to hostPath volumes.
		if err := os.Chown(dir, 65532, 65532); err != nil {
			t.Fatal(err)
		}
		pv := &corev1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("local-%d", i)},
			Spec: corev1.PersistentVolumeSpec{
				StorageClassName:              "local",
				Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("4Gi")},
				AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
				PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: dir}},
			},
		}
		if _, err := c.Client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

func kubectlFor(t *testing.T, c *devcluster.Cluster) func(args ...string) string {
	return func(args ...string) string {
		t.Helper()
		out, err := c.Kubectl(context.Background(), args...)
		if err != nil {
			t.Fatalf("kubectl %s: %v", strings.Join(args, " "), err)
		}
		return out
	}
}

// helmFor runs bin/helm against the cluster and returns its combined output.
func helmFor(t *testing.T, c *devcluster.Cluster) func(args ...string) (string, error) {
	bin, err := testenv.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	return func(args ...string) (string, error) {
		cmd := exec.Command(filepath.Join(bin, "helm"), append([]string{"--kubeconfig", c.Kubeconfig}, args...)...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
}

// buildImage builds the program pkg statically into /<entry> of an image
// tagged tag, imports it, and returns the binary.
func buildImage(t *testing.T, c *devcluster.Cluster, root, pkg, tag, entry string) string {
	t.Helper()
	binary := filepath.Join(t.TempDir(), entry)
	build := exec.Command("go", "build", "-trimpath", "-o", binary, pkg)
	build.Dir, build.Env = root, append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building %s: %v\n%s", pkg, err, out)
	}
	if err := c.BuildImage(context.Background(), binary, tag, entry, "65532:65532"); err != nil {
		t.Fatal(err)
	}
	return binary
}

// applyYAML writes manifest to a file and applies it.
func applyYAML(t *testing.T, c *devcluster.Cluster, manifest string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "manifest.yaml")
	if err := os.WriteFile(path, []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	kubectlFor(t, c)("apply", "-f", path)
}
