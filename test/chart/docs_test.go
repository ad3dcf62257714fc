package chart

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/fencer-io/fencer/internal/identity"
)

// docCommands returns the commands in docs/install.md's ```sh blocks, with
// backslash continuations joined and comments dropped.
func docCommands(t *testing.T) []string {
	t.Helper()
	f, err := os.Open(filepath.Join(root, "docs", "install.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var cmds []string
	var cur strings.Builder
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "```sh"):
			in = true
		case strings.HasPrefix(line, "```"):
			in = false
		case in:
			if i := strings.Index(line, " #"); i >= 0 {
				line = line[:i]
			}
			line = strings.TrimSpace(line)
			if cont, ok := strings.CutSuffix(line, "\\"); ok {
				cur.WriteString(strings.TrimSpace(cont) + " ")
				continue
			}
			cur.WriteString(line)
			if c := strings.TrimSpace(cur.String()); c != "" {
				cmds = append(cmds, c)
			}
			cur.Reset()
		}
	}
	return cmds
}

// TestInstallDocCommands runs every command of docs/install.md, verbatim
// and in order, against the real apiserver, so that a user can follow the
// page. The documented Helm installs are alternatives, so the previous
// release is uninstalled before each. What cannot run here is named with
// the test that runs it, and a new command in the page fails this test until
// it is covered.
func TestInstallDocCommands(t *testing.T) {
	elsewhere := map[string]string{
		"make image": "make test-image (runs `make image`)",
		"make image IMAGE=registry.example/fencer:0.1.0":                "make test-image (the IMAGE variable only sets the tag)",
		"crane push bin/fencer-image.tar registry.example/fencer:0.1.0": "make test-image (TestCranePushAsDocumented, against a loopback registry)",
		"helm test fencer -n fencer-system --logs":                      "make test-real-node (runs it on a real node, passing and failing) and make test-dev-smoke",
	}
	// The Helm installs and the kustomize install are alternatives: each
	// starts from a cluster without the previous one, and `helm upgrade`
	// upgrades the page's first (default) Helm install.
	installed, firstInstall := false, ""
	uninstall := func() {
		if installed {
			tool(t, "helm", "uninstall", "fencer", "-n", "fencer-system", "--wait")
			// A new cluster has no etcd volumes of an earlier install, which
			// the chart would refuse to come back on with another number of
			// members. A claim still in use stays Terminating, which the
			// chart's check passes over.
			tool(t, "kubectl", "-n", "fencer-system", "delete", "pvc", "-l", "app.kubernetes.io/instance=fencer,app.kubernetes.io/component=etcd", "--wait=false")
			installed = false
		}
	}
	run := func(c string) {
		t.Logf("running: %s", c)
		args := strings.Fields(strings.ReplaceAll(c, "'", ""))
		tool(t, args[0], args[1:]...)
	}
	for _, c := range docCommands(t) {
		if where, ok := elsewhere[c]; ok {
			t.Logf("%s: exercised by %s", c, where)
			continue
		}
		switch {
		case strings.HasPrefix(c, "helm install ") && strings.Fields(c)[2] != "fencer":
			// A second install, next to the first: it must coexist, and then goes.
			release, ns := strings.Fields(c)[2], strings.Fields(c)[5]
			if !installed {
				run(firstInstall)
				installed = true
			}
			run(c)
			tool(t, "helm", "uninstall", release, "-n", ns, "--wait")
		case strings.HasPrefix(c, "helm install "):
			uninstall()
			if firstInstall == "" {
				firstInstall = c
			}
			if strings.Contains(c, "certManager.enabled=true") {
				installCertManagerCRDs(t)
			}
			run(c)
			installed = true
		case strings.HasPrefix(c, "kubectl -n fencer-system create configmap apiserver-webhook-ca "):
			// The CA of the apiserver's webhook client certificate: the page's
			// file name, written to a temporary directory.
			ca, err := identity.NewCA("webhook-client-ca", time.Now())
			if err != nil {
				t.Fatal(err)
			}
			file := filepath.Join(t.TempDir(), "webhook-client-ca.crt")
			if err := os.WriteFile(file, ca.CertPEM, 0o600); err != nil {
				t.Fatal(err)
			}
			run(strings.Replace(c, "=webhook-client-ca.crt", "="+file, 1))
		case c == "kubectl apply -k config/default" || c == "kubectl apply -k config/lease-delete-webhook":
			uninstall()
			run(c)
			removeKustomizeInstall(t, strings.Fields(c)[3])
		case strings.HasPrefix(c, "helm upgrade "):
			if !installed {
				run(firstInstall)
				installed = true
			}
			run(c)
		case strings.HasPrefix(c, "helm uninstall "):
			run(c)
			installed = false
		default:
			t.Fatalf("docs/install.md has a command no test runs: %q", c)
		}
	}
	// What the page promises after the last command, uninstall.
	tool(t, "kubectl", "get", "crd", "leases.fencer.io", "idranges.fencer.io", "workloadleases.fencer.io")
	if _, err := toolErr("kubectl", "get", "validatingwebhookconfiguration", "fencer-fencing"); err == nil {
		t.Fatal("the webhook configuration survived `helm uninstall`")
	}
}

// certManagerVersion is the cert-manager whose CRDs the cert-manager
// variant is installed against.
const certManagerVersion = "v1.19.2"

// installCertManagerCRDs applies cert-manager's own Issuer and Certificate
// CRDs, from its Go module, so the cert-manager variant installs for real.
// No cert-manager controller runs: the objects are created, not acted on.
func installCertManagerCRDs(t *testing.T) {
	t.Helper()
	out, err := exec.Command("go", "mod", "download", "-json", "github.com/cert-manager/cert-manager@"+certManagerVersion).Output()
	if err != nil {
		t.Fatalf("downloading cert-manager %s for its CRDs: %v", certManagerVersion, err)
	}
	var mod struct{ Dir string }
	if err := json.Unmarshal(out, &mod); err != nil || mod.Dir == "" {
		t.Fatalf("go mod download: %v %s", err, out)
	}
	crds := filepath.Join(mod.Dir, "deploy", "crds")
	tool(t, "kubectl", "apply", "-f", filepath.Join(crds, "cert-manager.io_issuers.yaml"), "-f", filepath.Join(crds, "cert-manager.io_certificates.yaml"))
	tool(t, "kubectl", "wait", "--for=condition=Established", "--timeout=60s", "crd/issuers.cert-manager.io", "crd/certificates.cert-manager.io")
}

// removeKustomizeInstall deletes what `kubectl apply -k <dir>` (config/default
// or an overlay of it) created, except the namespace and the backup PVC (envtest runs no
// controllers, so a deleted namespace would never finish terminating, nor a
// PVC lose its pvc-protection finalizer) and the CRDs (kept, as Helm keeps
// them; the next install adopts them).
func removeKustomizeInstall(t *testing.T, dir string) {
	t.Helper()
	var keep []string
	for _, doc := range strings.Split(tool(t, "kubectl", "kustomize", dir), "\n---") {
		var meta struct{ Kind string }
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatal(err)
		}
		if meta.Kind != "" && meta.Kind != "Namespace" && meta.Kind != "CustomResourceDefinition" && meta.Kind != "PersistentVolumeClaim" {
			keep = append(keep, doc)
		}
	}
	path := filepath.Join(t.TempDir(), "kustomize-objects.yaml")
	if err := os.WriteFile(path, []byte(strings.Join(keep, "\n---\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	tool(t, "kubectl", "delete", "-f", path, "--wait=true")
}
