package chart

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/fencer-io/fencer/test/support/devcluster"
)

// TestDefaultInstallSchedulesOnOneAndThreeNodes installs the chart with no
// values onto a one-node and a three-node cluster (a real control plane with
// scheduler and controllers; kwok nodes stand in for kubelets, so "Ready"
// here means scheduled and started, not the manager's own readiness, which
// the real-node test proves). Every pod must be scheduled. On three nodes
// the HA profile, one value away, must place the etcd members on three
// different nodes.
func TestDefaultInstallSchedulesOnOneAndThreeNodes(t *testing.T) {
	for _, tc := range []struct {
		nodes int
		args  []string
	}{
		{1, nil},
		{3, nil},
		{3, []string{"--set", "etcd.bundled.replicas=3"}},
	} {
		t.Run(fmt.Sprintf("%d nodes %v", tc.nodes, tc.args), func(t *testing.T) {
			c := startCluster(t, tc.nodes)
			kc := func(args ...string) string {
				t.Helper()
				return clusterTool(t, c, "kubectl", args...)
			}
			clusterTool(t, c, "helm", append([]string{"install", "fencer", chartDir(), "--namespace", "fencer-system", "--create-namespace"}, tc.args...)...)
			kc("-n", "fencer-system", "rollout", "status", "deployment/fencer", "--timeout=120s")
			kc("-n", "fencer-system", "rollout", "status", "statefulset/fencer-etcd", "--timeout=120s")
			pods, err := c.Client.CoreV1().Pods("fencer-system").List(context.Background(), metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			etcdNodes := map[string]bool{}
			for _, p := range pods.Items {
				if p.Spec.NodeName == "" {
					t.Errorf("pod %s is not scheduled: %+v", p.Name, p.Status.Conditions)
				}
				if p.Labels["app.kubernetes.io/component"] == "etcd" {
					etcdNodes[p.Spec.NodeName] = true
				}
			}
			if want := len(tc.args)/2*2 + 1; len(etcdNodes) != want {
				t.Errorf("etcd members on %d nodes, want %d", len(etcdNodes), want)
			}
			t.Logf("pods:\n%s", kc("-n", "fencer-system", "get", "pods", "-o", "wide"))
		})
	}
}

// startCluster runs a dev cluster with n kwok nodes and a default
// StorageClass backed by pre-made volumes, as a cluster with a volume
// provisioner would offer; it stops when the test ends.
func startCluster(t *testing.T, n int) *devcluster.Cluster {
	t.Helper()
	ctx := context.Background()
	stages, err := devcluster.KwokStages(ctx, filepath.Join(root, "hack", "tools"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := devcluster.Start(ctx, devcluster.Options{BinDir: bin, Dir: t.TempDir(), Nodes: n, KwokStages: stages})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop() })
	if err := defaultStorage(ctx, c.Client, 6); err != nil {
		t.Fatal(err)
	}
	return c
}

func defaultStorage(ctx context.Context, cs kubernetes.Interface, volumes int) error {
	immediate := storagev1.VolumeBindingImmediate
	sc := &storagev1.StorageClass{
		ObjectMeta:        metav1.ObjectMeta{Name: "standard", Annotations: map[string]string{"storageclass.kubernetes.io/is-default-class": "true"}},
		Provisioner:       "kubernetes.io/no-provisioner",
		VolumeBindingMode: &immediate,
	}
	if _, err := cs.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{}); err != nil {
		return err
	}
	for i := range volumes {
		pv := &corev1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pv-%d", i)},
			Spec: corev1.PersistentVolumeSpec{
				StorageClassName:       "standard",
				Capacity:               corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("8Gi")},
				AccessModes:            []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				PersistentVolumeSource: corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: fmt.Sprintf("/tmp/pv-%d", i)}},
			},
		}
		if _, err := cs.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	return nil
}

// clusterTool runs bin/<name> against cluster c.
func clusterTool(t *testing.T, c *devcluster.Cluster, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out, err := runTool(ctx, c.Kubeconfig, name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v", name, strings.Join(args, " "), err)
	}
	return out
}
