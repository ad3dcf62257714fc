package chart

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
		"helm test fencer -n fencer-system":                             "make test-dev-smoke (runs the hook's commands against a running fencer)",
	}
	installed := false
	for _, c := range docCommands(t) {
		if where, ok := elsewhere[c]; ok {
			t.Logf("%s: exercised by %s", c, where)
			continue
		}
		args := strings.Fields(strings.ReplaceAll(c, "'", ""))
		switch {
		case strings.HasPrefix(c, "helm install "):
			if installed {
				tool(t, "helm", "uninstall", "fencer", "-n", "fencer-system", "--wait")
			}
			if strings.Contains(c, "certManager.enabled=true") {
				// cert-manager's APIs are not served by this apiserver: render and
				// check the release as helm would, without creating it.
				args = append(args, "--dry-run=client")
				installed = false
			} else {
				installed = true
			}
		case strings.HasPrefix(c, "helm uninstall "):
			installed = false
		case strings.HasPrefix(c, "helm upgrade "), strings.HasPrefix(c, "kubectl apply -k "):
		default:
			t.Fatalf("docs/install.md has a command no test runs: %q", c)
		}
		t.Logf("running: %s", c)
		tool(t, args[0], args[1:]...)
	}
	// What the page promises after the last command, uninstall.
	tool(t, "kubectl", "get", "crd", "leases.fencer.io", "idranges.fencer.io")
	if _, err := toolErr("kubectl", "get", "validatingwebhookconfiguration", "fencer-fencing"); err == nil {
		t.Fatal("the webhook configuration survived `helm uninstall`")
	}
}
