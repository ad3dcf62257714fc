package smoke

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"
)

// runHelmTestHook runs the chart's `helm test` pod against the dev cluster,
// where fencer is running. There is no container runtime here, so the pod
// itself cannot start; instead each of its containers' kubectl commands runs
// as a local process, in order, authenticated as the hook's own service
// account (so the hook's RBAC is exercised too), with the probe ConfigMap
// written where the pod mounts it. Then the webhook is pointed at a dead
// address, and the same probe must fail: it passes only when the webhook
// answers.
func runHelmTestHook(t *testing.T, bin, root, adminKubeconfig string, kubectl func(args ...string) string) {
	const ns = "helm-test"
	kubectl("create", "namespace", ns)
	rendered, err := exec.Command(filepath.Join(bin, "helm"), "template", "fencer", filepath.Join(root, "charts", "fencer"),
		"--namespace", ns, "--show-only", "templates/tests/test-install.yaml").Output()
	if err != nil {
		t.Fatalf("helm template of the test hook: %v", err)
	}
	dir := t.TempDir()
	var pod corev1.Pod
	var objects []string
	probeData := map[string]map[string]string{} // ConfigMap name -> data
	for _, doc := range strings.Split(string(rendered), "\n---") {
		var meta struct{ Kind string }
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil || meta.Kind == "" {
			continue
		}
		switch meta.Kind {
		case "Pod":
			if err := yaml.Unmarshal([]byte(doc), &pod); err != nil {
				t.Fatal(err)
			}
		case "ConfigMap":
			var cm corev1.ConfigMap
			if err := yaml.Unmarshal([]byte(doc), &cm); err != nil {
				t.Fatal(err)
			}
			probeData[cm.Name] = cm.Data
			objects = append(objects, doc)
		default:
			objects = append(objects, doc)
		}
	}
	hookObjects := filepath.Join(dir, "hook.yaml")
	if err := os.WriteFile(hookObjects, []byte(strings.Join(objects, "\n---\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	kubectl("apply", "-f", hookObjects)

	// The pod's volumes, as the kubelet would mount them.
	mounts := map[string]string{}
	for _, v := range pod.Spec.Volumes {
		if v.ConfigMap == nil {
			continue
		}
		path := filepath.Join(dir, v.Name)
		if err := os.MkdirAll(path, 0o755); err != nil {
			t.Fatal(err)
		}
		for k, val := range probeData[v.ConfigMap.Name] {
			if err := os.WriteFile(filepath.Join(path, k), []byte(val), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		mounts[v.Name] = path
	}
	saKubeconfig := tokenKubeconfig(t, adminKubeconfig, strings.TrimSpace(kubectl("create", "token", pod.Spec.ServiceAccountName, "-n", ns)), dir)
	run := func(c corev1.Container) (string, error) {
		if len(c.Command) != 1 || c.Command[0] != "kubectl" {
			t.Fatalf("container %s runs %v; this test can only run kubectl", c.Name, c.Command)
		}
		args := append([]string{"--kubeconfig", saKubeconfig, "--namespace", ns}, c.Args...)
		for i, a := range args {
			for _, m := range c.VolumeMounts {
				if strings.HasPrefix(a, m.MountPath+"/") {
					args[i] = mounts[m.Name] + strings.TrimPrefix(a, m.MountPath)
				}
			}
		}
		out, err := exec.Command(filepath.Join(bin, "kubectl"), args...).CombinedOutput()
		return string(out), err
	}
	for _, c := range append(pod.Spec.InitContainers, pod.Spec.Containers...) {
		if out, err := run(c); err != nil {
			t.Fatalf("helm test container %s failed against a running fencer: %v\n%s", c.Name, err, out)
		}
	}

	// With the webhook unreachable the probe must fail.
	raw := kubectl("get", "mutatingwebhookconfiguration", "fencer-fencing", "-o", "yaml")
	var vwc admissionregistrationv1.MutatingWebhookConfiguration
	if err := yaml.Unmarshal([]byte(raw), &vwc); err != nil {
		t.Fatal(err)
	}
	broken := vwc.DeepCopy()
	dead := "https://127.0.0.1:1/validate"
	for i := range broken.Webhooks {
		broken.Webhooks[i].ClientConfig.URL = &dead
	}
	apply := func(v *admissionregistrationv1.MutatingWebhookConfiguration) {
		v.ResourceVersion = ""
		b, err := yaml.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		f := filepath.Join(dir, "vwc.yaml")
		if err := os.WriteFile(f, b, 0o644); err != nil {
			t.Fatal(err)
		}
		kubectl("replace", "-f", f)
	}
	apply(broken)
	defer apply(&vwc)
	main := pod.Spec.Containers[len(pod.Spec.Containers)-1]
	out, err := run(main)
	if err == nil {
		t.Fatalf("helm test container %s passed with the webhook unreachable:\n%s", main.Name, out)
	}
	if !strings.Contains(out, "failed calling webhook") {
		t.Fatalf("helm test container %s failed, but not because the webhook was unreachable:\n%s", main.Name, out)
	}
}

// tokenKubeconfig writes a kubeconfig for the admin kubeconfig's cluster
// that authenticates with token.
func tokenKubeconfig(t *testing.T, admin, token, dir string) string {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(admin)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range cfg.AuthInfos {
		a.ClientCertificate, a.ClientKey, a.ClientCertificateData, a.ClientKeyData = "", "", nil, nil
		a.Token = token
	}
	path := filepath.Join(dir, "sa.kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}
