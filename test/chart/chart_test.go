// Package chart tests charts/fencer with the real helm and kubectl from bin/
// against a real kube-apiserver (envtest): every documented variant lints,
// renders and passes server-side validation, and install, upgrade and
// uninstall behave as docs/install.md says.
package chart

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/test/support/testenv"
)

var (
	env        *envtest.Environment
	cl         client.Client
	kubeconfig string
	bin, root  string
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	fail := func(err error) int { fmt.Fprintln(os.Stderr, err); return 1 }
	var err error
	if bin, err = testenv.BinDir(); err != nil {
		return fail(err)
	}
	if root, err = testenv.RepoRoot(); err != nil {
		return fail(err)
	}
	// No CRDs installed up front: the chart installs them.
	env = &envtest.Environment{BinaryAssetsDirectory: bin, Scheme: testenv.Scheme()}
	cfg, err := env.Start()
	if err != nil {
		return fail(err)
	}
	defer func() { _ = env.Stop() }()
	if cl, err = client.New(cfg, client.Options{Scheme: env.Scheme}); err != nil {
		return fail(err)
	}
	admin, err := env.AddUser(envtest.User{Name: "admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return fail(err)
	}
	raw, err := admin.KubeConfig()
	if err != nil {
		return fail(err)
	}
	dir, err := os.MkdirTemp("", "fencer-chart")
	if err != nil {
		return fail(err)
	}
	defer os.RemoveAll(dir)
	kubeconfig = filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, raw, 0o600); err != nil {
		return fail(err)
	}
	return m.Run()
}

// tool runs bin/<name> and returns its stdout, failing the test on error.
func tool(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := toolErr(name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v", name, strings.Join(args, " "), err)
	}
	return out
}

func toolErr(name string, args ...string) (string, error) {
	return runTool(context.Background(), kubeconfig, name, args...)
}

// runTool runs bin/<name> against the cluster of kc.
func runTool(ctx context.Context, kc, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(bin, name), args...)
	cmd.Dir = root // docs/install.md's commands use paths relative to the repository
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kc, "HELM_CACHE_HOME="+os.TempDir()+"/helm-cache", "HELM_CONFIG_HOME="+os.TempDir()+"/helm-config", "HELM_DATA_HOME="+os.TempDir()+"/helm-data")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%w: %s", err, stderr.String())
	}
	return stdout.String(), nil
}

// variant is one documented way to install (docs/install.md).
type variant struct {
	name string
	args []string
}

var variants = []variant{
	{"default", nil},
	{"external etcd with TLS", []string{"--set", "etcd.endpoints={https://etcd-0.example:2379,https://etcd-1.example:2379}", "--set", "etcd.tlsSecret=fencer-etcd-tls"}},
	{"cert-manager", []string{"--set", "certManager.enabled=true"}},
	{"no CRDs", []string{"--set", "crds.enabled=false"}},
	{"ServiceMonitor", []string{"--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.serviceMonitor.labels.release=kube-prometheus-stack", "--set", "metrics.serviceMonitor.interval=15s", "--api-versions", "monitoring.coreos.com/v1"}},
	{"no NetworkPolicy", []string{"--set", "networkPolicy.enabled=false"}},
	{"HA etcd", []string{"--set", "etcd.bundled.replicas=3"}},
	{"external etcd with identities", []string{"--set", "etcd.endpoints={https://etcd-0.example:2379}", "--set", "etcd.tlsSecret=fencer-etcd-tls", "--set", "etcd.pkiSecret=fencer-etcd-ca", "--set", "etcd.enableAuth=true"}},
	{"second install", []string{"--set", "fullnameOverride=team-b", "--set", "crds.enabled=false", "--set", "namespaces={b1,b2}", "--set", "etcd.prefix=/team-b"}},
	{"scheduling knobs", []string{"--set", "nodeSelector.pool=infra", "--set", "tolerations[0].key=infra", "--set", "tolerations[0].operator=Exists", "--set", "priorityClassName=system-cluster-critical", "--set", "podLabels.team=a", "--set", "podAnnotations.note=x", "--set", "commonLabels.env=prod", "--set", "extraArgs={--etcd-step-down-after=10s}", "--set", "extraEnv[0].name=X", "--set", "extraEnv[0].value=y", "--set", "podDisruptionBudget.enabled=false", "--set", "serviceAccount.create=false", "--set", "serviceAccount.name=existing", "--set", "global.imageRegistry=r.example"}},
	{"ephemeral etcd without backups", []string{"--set", "etcd.bundled.storage.persistent=false", "--set", "etcd.backup.enabled=false"}},
	{"no helm test", []string{"--set", "helmTest.enabled=false"}},
	{"PodMonitor", []string{"--set", "metrics.podMonitor.enabled=true", "--api-versions", "monitoring.coreos.com/v1"}},
	{"alerts and dashboard", monitoring},
	{"metrics over plain HTTP", []string{"--set", "metrics.secure=false"}},
}

func chartDir() string { return filepath.Join(root, "charts", "fencer") }

func find(objs []*unstructured.Unstructured, kind string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == kind {
			out = append(out, o)
		}
	}
	return out
}

func one(t *testing.T, objs []*unstructured.Unstructured, kind string, into any) {
	t.Helper()
	found := find(objs, kind)
	if len(found) != 1 {
		t.Fatalf("want one %s, rendered %d", kind, len(found))
	}
	raw, err := yaml.Marshal(found[0].Object)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(raw, into); err != nil {
		t.Fatal(err)
	}
}

// TestVariantsLintRenderAndValidate: helm lint and template for each
// variant, and every rendered object validated by the real apiserver with
// kubectl apply --dry-run=server. Objects of APIs this apiserver does not
// serve (cert-manager's, the Prometheus operator's) are checked to render
// and then left out of the dry run.
func TestVariantsLintRenderAndValidate(t *testing.T) {
	tool(t, "kubectl", "create", "namespace", "fencer-system")
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			lintArgs := []string{"lint", chartDir()}
			for i := 0; i < len(v.args); i++ {
				if v.args[i] == "--set" {
					lintArgs = append(lintArgs, v.args[i], v.args[i+1])
					i++
				}
			}
			tool(t, "helm", lintArgs...)
			objs := render(t, v.args...)
			var served []string
			for _, o := range objs {
				if strings.HasPrefix(o.GetAPIVersion(), "cert-manager.io/") || strings.HasPrefix(o.GetAPIVersion(), "monitoring.coreos.com/") {
					continue
				}
				raw, err := yaml.Marshal(o.Object)
				if err != nil {
					t.Fatal(err)
				}
				served = append(served, string(raw))
			}
			file := filepath.Join(t.TempDir(), "rendered.yaml")
			if err := os.WriteFile(file, []byte(strings.Join(served, "\n---\n")), 0o644); err != nil {
				t.Fatal(err)
			}
			tool(t, "kubectl", "apply", "--dry-run=server", "-f", file)
		})
	}
}

func TestDefaultRendering(t *testing.T) {
	objs := render(t)
	var dep appsv1.Deployment
	one(t, objs, "Deployment", &dep)
	if *dep.Spec.Replicas != 2 {
		t.Errorf("replicas %d, want 2", *dep.Spec.Replicas)
	}
	pod := dep.Spec.Template.Spec
	if sc := pod.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.SeccompProfile == nil || sc.SeccompProfile.Type != "RuntimeDefault" {
		t.Errorf("pod securityContext %+v", pod.SecurityContext)
	}
	c := pod.Containers[0]
	if sc := c.SecurityContext; sc == nil || !*sc.ReadOnlyRootFilesystem || *sc.AllowPrivilegeEscalation || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
		t.Errorf("container securityContext %+v", c.SecurityContext)
	}
	args := strings.Join(c.Args, " ")
	for _, want := range []string{"--leader-elect=true", "--webhook-cert-rotation", "--kube-api-qps=50", "--kube-api-burst=100", "--lease-workers=16",
		"--etcd-endpoints=https://fencer-etcd-0.fencer-etcd.fencer-system.svc:2379 ", "--etcd-pki-secret=fencer-etcd-ca", "--etcd-server-secret=fencer-etcd-server",
		"--etcd-backup-secret=fencer-etcd-backup", "--etcd-enable-auth", "--etcd-credentials-secret=fencer-etcd-client", "--webhook-config-name=fencer-fencing"} {
		if !strings.Contains(args, want) {
			t.Errorf("args %q lack %q", args, want)
		}
	}
	var memLimit bool
	for _, e := range c.Env {
		if e.Name == "GOMEMLIMIT" && e.ValueFrom != nil && e.ValueFrom.ResourceFieldRef != nil && e.ValueFrom.ResourceFieldRef.Resource == "limits.memory" {
			memLimit = true
		}
	}
	if !memLimit {
		t.Errorf("GOMEMLIMIT does not follow the container's memory limit: env %+v", c.Env)
	}
	if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Errorf("readiness probe %+v", c.ReadinessProbe)
	}

	vwc := find(objs, "ValidatingWebhookConfiguration")
	if len(vwc) != 1 {
		t.Fatalf("%d webhook configurations", len(vwc))
	}
	whs, _, _ := unstructured.NestedSlice(vwc[0].Object, "webhooks")
	excludedBy := func(wh any) string {
		sel, _, _ := unstructured.NestedSlice(wh.(map[string]any), "namespaceSelector", "matchExpressions")
		return fmt.Sprint(sel[0].(map[string]any)["values"])
	}
	// Fenced objects in the release namespace are judged (the helm test
	// probe lives there), and its Leases' DELETEs received (they carry no
	// finalizer); the parent webhook, which has no label selector, skips
	// it so fencer's own pods can be evicted while it is down.
	for _, wh := range whs {
		name, _ := wh.(map[string]any)["name"].(string)
		excluded := excludedBy(wh)
		if !strings.Contains(excluded, "kube-system") {
			t.Errorf("%s: namespaceSelector excludes %s; want kube-system", name, excluded)
		}
		if release := strings.Contains(excluded, "fencer-system"); release != (name == "parent.fencer.io") {
			t.Errorf("%s: excludes the release namespace: %v", name, release)
		}
	}
	if fp := whs[0].(map[string]any)["failurePolicy"]; fp != "Fail" {
		t.Errorf("failurePolicy %v", fp)
	}
	for _, crd := range find(objs, "CustomResourceDefinition") {
		if crd.GetAnnotations()["helm.sh/resource-policy"] != "keep" {
			t.Errorf("CRD %s is not kept on uninstall", crd.GetName())
		}
	}
	if n := len(find(objs, "CustomResourceDefinition")); n != 3 { // Lease, IDRange, WorkloadLease
		t.Errorf("%d CRDs rendered", n)
	}
	// One etcd member fits a one-node cluster; a PDB for it would only block drains.
	if n := len(find(objs, "StatefulSet")) + len(find(objs, "PodDisruptionBudget")); n != 2 {
		t.Errorf("want the etcd StatefulSet and the manager's PDB, got %d", n)
	}
	var sts appsv1.StatefulSet
	one(t, objs, "StatefulSet", &sts)
	if *sts.Spec.Replicas != 1 || sts.Spec.Template.Spec.Affinity != nil {
		t.Errorf("default etcd: %d replicas, affinity %+v; want 1 member, schedulable anywhere", *sts.Spec.Replicas, sts.Spec.Template.Spec.Affinity)
	}
	etcdArgs := strings.Join(sts.Spec.Template.Spec.Containers[0].Args, " ")
	for _, want := range []string{"--client-cert-auth", "--peer-client-cert-auth", "--listen-client-urls=https://", "--listen-peer-urls=https://", "--quota-backend-bytes=1610612736", "--auto-compaction-mode=periodic"} {
		if !strings.Contains(etcdArgs, want) {
			t.Errorf("etcd args %q lack %q", etcdArgs, want)
		}
	}
	if len(find(objs, "CronJob")) != 1 || len(find(objs, "NetworkPolicy")) != 2 {
		t.Errorf("want the backup CronJob and two NetworkPolicies by default")
	}
}

// TestRBACIsTheGeneratedOne: the chart grants exactly the rules
// controller-gen generated from the RBAC markers (a ClusterRole, and a Role
// for the release namespace), nothing broader.
func TestRBACIsTheGeneratedOne(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(root, "config", "rbac", "role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	generated := map[string][]rbacv1.PolicyRule{}
	for _, doc := range strings.Split(string(raw), "\n---\n") {
		var r rbacv1.Role // a ClusterRole has the same shape
		var meta struct{ Kind string }
		if err := yaml.Unmarshal([]byte(doc), &r); err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatal(err)
		}
		generated[meta.Kind] = r.Rules
	}
	objs := render(t)
	for _, kind := range []string{"ClusterRole", "Role"} {
		var rendered []rbacv1.PolicyRule
		for _, o := range find(objs, kind) {
			if o.GetName() != "fencer-manager" {
				continue
			}
			var r rbacv1.Role
			b, _ := yaml.Marshal(o.Object)
			if err := yaml.Unmarshal(b, &r); err != nil {
				t.Fatal(err)
			}
			rendered = r.Rules
			if kind == "Role" && o.GetNamespace() != "fencer-system" {
				t.Errorf("Role in namespace %q, want the release namespace", o.GetNamespace())
			}
		}
		if len(generated[kind]) == 0 || !reflect.DeepEqual(rendered, generated[kind]) {
			t.Errorf("chart %s rules differ from config/rbac/role.yaml:\n%v\n%v", kind, rendered, generated[kind])
		}
	}
}

func TestVariantsRenderWhatTheySay(t *testing.T) {
	ext := render(t, variants[1].args...)
	if len(find(ext, "StatefulSet")) != 0 {
		t.Error("external etcd still renders the bundled StatefulSet")
	}
	var dep appsv1.Deployment
	one(t, ext, "Deployment", &dep)
	if args := strings.Join(dep.Spec.Template.Spec.Containers[0].Args, " "); !strings.Contains(args, "--etcd-endpoints=https://etcd-0.example:2379,https://etcd-1.example:2379") || !strings.Contains(args, "--etcd-ca-file=/etc/fencer/etcd-tls/ca.crt") {
		t.Errorf("external etcd args: %s", args)
	}
	cm := render(t, variants[2].args...)
	if len(find(cm, "Certificate")) != 3 || len(find(cm, "Issuer")) != 2 {
		t.Error("cert-manager variant: want Certificates for the webhook, the etcd CA and the etcd members, and two Issuers")
	}
	one(t, cm, "Deployment", &dep)
	if args := strings.Join(dep.Spec.Template.Spec.Containers[0].Args, " "); strings.Contains(args, "--webhook-cert-rotation") || strings.Contains(args, "--etcd-server-secret") || !strings.Contains(args, "--etcd-pki-create=false") {
		t.Error("cert-manager variant still issues certificates itself, or creates the CA cert-manager issues")
	}
	ha := render(t, "--set", "etcd.bundled.replicas=3")
	var sts appsv1.StatefulSet
	one(t, ha, "StatefulSet", &sts)
	if aff := sts.Spec.Template.Spec.Affinity; *sts.Spec.Replicas != 3 || aff == nil || aff.PodAntiAffinity == nil || len(aff.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution) != 1 {
		t.Errorf("HA etcd: %d members, affinity %+v; want 3 on different nodes", *sts.Spec.Replicas, sts.Spec.Template.Spec.Affinity)
	}
	if n := len(find(ha, "PodDisruptionBudget")); n != 2 {
		t.Errorf("HA etcd: %d PDBs, want the manager's and etcd's", n)
	}
	one(t, ha, "Deployment", &dep)
	if args := strings.Join(dep.Spec.Template.Spec.Containers[0].Args, " "); !strings.Contains(args, "fencer-etcd-2.fencer-etcd.fencer-system.svc:2379") {
		t.Errorf("manager args with HA etcd: %s", args)
	}
	second := render(t, variants[8].args...)
	for _, kind := range []string{"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration", "ClusterRole"} {
		for _, o := range find(second, kind) {
			if !strings.HasPrefix(o.GetName(), "team-b-") {
				t.Errorf("second install's %s is named %s, clashing with the first", kind, o.GetName())
			}
		}
	}
	one(t, second, "Deployment", &dep)
	if args := strings.Join(dep.Spec.Template.Spec.Containers[0].Args, " "); !strings.Contains(args, "--namespaces=b1,b2") || !strings.Contains(args, "--webhook-config-name=team-b-fencing") || !strings.Contains(args, "--etcd-prefix=/team-b") {
		t.Errorf("second install's args: %s", args)
	}
	var role rbacv1.ClusterRole
	for _, o := range find(second, "ClusterRole") {
		if o.GetName() == "team-b-manager" {
			b, _ := yaml.Marshal(o.Object)
			if err := yaml.Unmarshal(b, &role); err != nil {
				t.Fatal(err)
			}
		}
	}
	var names []string
	for _, r := range role.Rules {
		names = append(names, r.ResourceNames...)
	}
	if strings.Join(names, ",") != "team-b-etcd-client,team-b-fencing" {
		t.Errorf("second install's ClusterRole names %v; want only its own Secret and webhook configurations", names)
	}
	knobs := render(t, variants[9].args...)
	one(t, knobs, "Deployment", &dep)
	spec := dep.Spec.Template.Spec
	if spec.NodeSelector["pool"] != "infra" || len(spec.Tolerations) != 1 || spec.PriorityClassName != "system-cluster-critical" || spec.ServiceAccountName != "existing" ||
		dep.Spec.Template.Labels["team"] != "a" || dep.Spec.Template.Annotations["note"] != "x" || dep.Labels["env"] != "prod" || spec.Containers[0].Env[len(spec.Containers[0].Env)-1].Name != "X" ||
		!strings.Contains(strings.Join(spec.Containers[0].Args, " "), "--etcd-step-down-after=10s") {
		t.Errorf("scheduling knobs not applied: %+v", dep)
	}
	if len(find(knobs, "PodDisruptionBudget")) != 0 || len(find(knobs, "ServiceAccount")) != 1 /* the helm test's */ {
		t.Error("podDisruptionBudget.enabled=false or serviceAccount.create=false ignored")
	}
	if len(find(render(t, variants[3].args...), "CustomResourceDefinition")) != 0 {
		t.Error("crds.enabled=false still renders CRDs")
	}
	sm := find(render(t, variants[4].args...), "ServiceMonitor")
	if len(sm) != 1 {
		t.Fatal("ServiceMonitor not rendered where the API exists")
	}
	endpoints, _, _ := unstructured.NestedSlice(sm[0].Object, "spec", "endpoints")
	if sm[0].GetLabels()["release"] != "kube-prometheus-stack" || len(endpoints) != 1 || endpoints[0].(map[string]any)["interval"] != "15s" {
		t.Errorf("ServiceMonitor labels %v, endpoints %v: want the release label and interval 15s", sm[0].GetLabels(), endpoints)
	}
	pm := find(render(t, "--set", "metrics.podMonitor.enabled=true", "--api-versions", "monitoring.coreos.com/v1"), "PodMonitor")
	if len(pm) != 1 {
		t.Fatal("PodMonitor not rendered where the API exists")
	}
	if sel, _, _ := unstructured.NestedStringMap(pm[0].Object, "spec", "selector", "matchLabels"); sel["app.kubernetes.io/component"] != "manager" {
		t.Errorf("the PodMonitor selects %v, not the manager pods", sel)
	}
	if len(find(render(t, "--set", "metrics.serviceMonitor.enabled=true"), "ServiceMonitor")) != 0 {
		t.Error("ServiceMonitor rendered although the API does not exist")
	}
	// helm test's pod, ServiceAccount, RBAC and probe, and nothing else.
	withTests, without := render(t), render(t, "--set", "helmTest.enabled=false")
	if len(withTests)-len(without) != 7 || len(find(without, "Pod")) != 0 || len(find(without, "ServiceAccount")) != 1 {
		t.Errorf("helmTest.enabled=false removes %d objects, want the 7 of helm test", len(withTests)-len(without))
	}
}

func TestValuesAreStrict(t *testing.T) {
	for args, want := range map[string]string{
		"replicaCount=0":              "minimum: got 0, want 1",
		"bogus=1":                     "additional properties 'bogus' not allowed",
		"etcd.endpoints[0]=etcd:2379": "does not match pattern",
		"webhook.failurePolicy=Maybe": "failurePolicy",
		"etcd.bundled.replicas=2":     "/etcd/bundled/replicas",
		"namespaces[0]=Bad_NS":        "does not match pattern",
		"extraArgs[0]=etcd-prefix":    "does not match pattern",
		// what the manager refuses at start, refused before the install
		"etcd.prefix=/a:b":                    "does not match pattern",
		"etcd.endpoints[0]=https://":          "does not match pattern",
		"etcd.endpoints[0]=https://etcd:port": "does not match pattern",
		"webhook.excludeNamespaces[0]=Bad_NS": "does not match pattern",
	} {
		out, err := toolErr("helm", "template", "fencer", chartDir(), "--set", args)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("--set %s: %v %s; want an error containing %q", args, err, out, want)
		}
	}
}

// TestInstallUpgradeUninstall: helm install into the control plane, upgrade
// with a changed value, uninstall keeping the CRDs and the Leases.
func TestInstallUpgradeUninstall(t *testing.T) {
	ctx := context.Background()
	tool(t, "helm", "install", "fencer", chartDir(), "--namespace", "fencer-system", "--create-namespace")
	tool(t, "kubectl", "wait", "--for=condition=Established", "--timeout=60s", "crd/leases.fencer.io", "crd/idranges.fencer.io", "crd/workloadleases.fencer.io")
	tool(t, "kubectl", "get", "validatingwebhookconfiguration", "fencer-fencing")
	tool(t, "kubectl", "get", "clusterrole", "fencer-manager")
	tool(t, "kubectl", "get", "clusterrolebinding", "fencer-manager")

	lease := &fencerv1.Lease{}
	lease.Name, lease.Namespace = "kept", "fencer-system"
	lease.Spec.HolderSelector.MatchLabels = map[string]string{"app": "x"}
	if err := cl.Create(ctx, lease); err != nil {
		t.Fatal(err)
	}

	// The manager's Secret policy: outside its namespace only its own
	// credentials Secret. (The policy may take a moment to load.)
	asManager := "--as=system:serviceaccount:fencer-system:fencer"
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, err := toolErr("kubectl", "create", "secret", "generic", "fencer-etcd-client", "-n", "default", asManager)
		if err != nil && strings.Contains(err.Error(), "may create or change only its etcd credentials Secret") {
			break
		}
		if err == nil {
			tool(t, "kubectl", "delete", "secret", "fencer-etcd-client", "-n", "default")
		}
		if time.Now().After(deadline) {
			t.Fatalf("the manager created an Opaque Secret outside its namespace: %v %s", err, out)
		}
		time.Sleep(time.Second)
	}
	tlsSecret := filepath.Join(t.TempDir(), "cred.yaml")
	if err := os.WriteFile(tlsSecret, []byte("apiVersion: v1\nkind: Secret\nmetadata: {name: fencer-etcd-client, namespace: default, labels: {app.kubernetes.io/managed-by: fencer}}\ntype: kubernetes.io/tls\ndata: {tls.crt: \"\", tls.key: \"\"}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tool(t, "kubectl", "create", "-f", tlsSecret, asManager)
	tool(t, "kubectl", "delete", "-f", tlsSecret)
	checkIgnoredLabelWarning(t, asManager)
	checkManagerPodPolicy(t, asManager)

	// What an installed release cannot change: each upgrade is refused
	// before it changes anything, naming the value.
	for set, want := range map[string]string{
		"etcd.bundled.replicas=3":      "etcd.bundled.replicas cannot change on an installed etcd (1 members now, 3 asked)",
		"etcd.prefix=/other":           "the etcd prefix cannot change on an installed release (/fencer now, /other asked",
		"extraArgs={--etcd-prefix=/x}": "the etcd prefix cannot change on an installed release (/fencer now, /x asked",
		"fullnameOverride=renamed":     "the release's etcd is the StatefulSet fencer-etcd, and these values name it renamed-etcd",
		"nameOverride=other":           "the release's etcd is the StatefulSet fencer-etcd, and these values name it fencer-other-etcd",
	} {
		if out, err := toolErr("helm", "upgrade", "fencer", chartDir(), "--namespace", "fencer-system", "--set", set); err == nil || !strings.Contains(out+err.Error(), want) {
			t.Errorf("helm upgrade --set %s: %v %s; want it refused with %q", set, err, out, want)
		}
	}
	// A second release in the namespace would share the manager's
	// leader-election Lease.
	for _, extra := range [][]string{nil, {"--set", "nameOverride=other"}} {
		args := append([]string{"install", "second", chartDir(), "--namespace", "fencer-system"}, extra...)
		if out, err := toolErr("helm", args...); err == nil || !strings.Contains(err.Error(), `namespace fencer-system already holds fencer's release "fencer"`) {
			t.Errorf("a second release in fencer-system %v: %v %s; want it refused", extra, err, out)
		}
	}
	tool(t, "helm", "upgrade", "fencer", chartDir(), "--namespace", "fencer-system", "--set", "replicaCount=3")
	var dep appsv1.Deployment
	if err := cl.Get(ctx, client.ObjectKey{Namespace: "fencer-system", Name: "fencer"}, &dep); err != nil {
		t.Fatal(err)
	}
	if *dep.Spec.Replicas != 3 {
		t.Fatalf("replicas after upgrade: %d", *dep.Spec.Replicas)
	}

	tool(t, "helm", "uninstall", "fencer", "--namespace", "fencer-system")
	tool(t, "kubectl", "get", "crd", "leases.fencer.io", "idranges.fencer.io", "workloadleases.fencer.io")
	if err := cl.Get(ctx, client.ObjectKeyFromObject(lease), &fencerv1.Lease{}); err != nil {
		t.Fatalf("the Lease did not survive uninstall: %v", err)
	}
	if _, err := toolErr("kubectl", "get", "validatingwebhookconfiguration", "fencer-fencing"); err == nil {
		t.Fatal("the webhook configuration survived uninstall")
	}
	checkKeptEtcdVolumes(t)
}

// checkKeptEtcdVolumes: an install that would come back on the kept
// volume of one etcd member with three members is refused (the member
// with data would keep its old cluster, the two others start a new one).
// Helm keeps a StatefulSet's claims at uninstall; the test makes one, with
// the labels the StatefulSet controller gives its claims, if this cluster's
// controllers made none. An install under another release name over it is
// refused too.
func checkKeptEtcdVolumes(t *testing.T) {
	t.Helper()
	if _, err := toolErr("kubectl", "get", "pvc", "data-fencer-etcd-0", "-n", "fencer-system"); err != nil {
		claim := filepath.Join(t.TempDir(), "claim.yaml")
		if err := os.WriteFile(claim, []byte("apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: data-fencer-etcd-0, namespace: fencer-system, labels: {app.kubernetes.io/name: fencer, app.kubernetes.io/instance: fencer, app.kubernetes.io/component: etcd}}\nspec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		tool(t, "kubectl", "create", "-f", claim)
		defer tool(t, "kubectl", "delete", "-f", claim, "--wait=false")
	}
	for _, c := range []struct {
		set, want string
	}{
		{"etcd.bundled.replicas=3", "the namespace keeps the volumes of etcd members [0] (PersistentVolumeClaims data-fencer-etcd-<n>"},
		{"fullnameOverride=renamed", "the namespace keeps the etcd volume data-fencer-etcd-0 of this release under another name"},
	} {
		if out, err := toolErr("helm", "install", "fencer", chartDir(), "--namespace", "fencer-system", "--set", c.set); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("helm install --set %s over one member's kept volume: %v %s; want it refused with %q", c.set, err, out, c.want)
			if err == nil {
				tool(t, "helm", "uninstall", "fencer", "--namespace", "fencer-system")
			}
		}
	}
	// An etcd on emptyDir never uses the claims: nothing to refuse.
	tool(t, "helm", "install", "fencer", chartDir(), "--namespace", "fencer-system", "--set", "etcd.bundled.replicas=3", "--set", "etcd.bundled.storage.persistent=false")
	tool(t, "helm", "uninstall", "fencer", "--namespace", "fencer-system", "--wait")
}

// checkManagerPodPolicy: as the manager, fencer's own annotations of a pod
// can be put and removed, and nothing else of it changed: not an image,
// not a label, not another annotation. The policy may take a moment to
// load.
func checkManagerPodPolicy(t *testing.T, asManager string) {
	t.Helper()
	pod := filepath.Join(t.TempDir(), "pod.yaml")
	if err := os.WriteFile(pod, []byte("apiVersion: v1\nkind: Pod\nmetadata: {name: policy-probe, namespace: default, labels: {app: a}, annotations: {team: a}}\nspec: {containers: [{name: c, image: registry.k8s.io/pause:3.10}]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tool(t, "kubectl", "create", "-f", pod)
	defer tool(t, "kubectl", "delete", "-f", pod, "--wait=false")
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := toolErr("kubectl", "label", "pod", "policy-probe", "-n", "default", "app=intruder", "--overwrite", asManager)
		if err != nil && strings.Contains(err.Error(), "not its labels, owners or finalizers") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the manager relabelled a pod: %v", err)
		}
		time.Sleep(time.Second)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"set", "image", "pod/policy-probe", "c=registry.example/evil:1"}, "not its spec"},
		{[]string{"annotate", "pod", "policy-probe", "team=b", "--overwrite"}, "only fencer's own annotations of a pod (lease.fencer.io/"},
		{[]string{"annotate", "pod", "policy-probe", "team-"}, "only fencer's own annotations of a pod (lease.fencer.io/"},
		{[]string{"annotate", "pod", "policy-probe", "lease.fencer.io/job=7", "leaseid.fencer.io/job=1a", "idrange.fencer.io/ids=block=1-10"}, ""},
		{[]string{"annotate", "pod", "policy-probe", "lease.fencer.io/job-", "leaseid.fencer.io/job-"}, ""},
	} {
		_, err := toolErr("kubectl", append(append(c.args, "-n", "default"), asManager)...)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("as the manager, kubectl %v: %v, want it allowed", c.args, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("as the manager, kubectl %v: %v, want it refused with %q", c.args, err, c.want)
		}
	}
}

// checkIgnoredLabelWarning: a fencer.io/lease label on a Lease (a
// kustomization's labels put it on every object) is applied with a warning
// that it fences nothing, which kubectl prints; the same Lease without the
// label, and the manager's own writes (asManager) with it, get none. The
// policy may take a moment to load.
func checkIgnoredLabelWarning(t *testing.T, asManager string) {
	t.Helper()
	dir := t.TempDir()
	manifest := func(name, labels string) string {
		path := filepath.Join(dir, name+".yaml")
		doc := "apiVersion: fencer.io/v1alpha1\nkind: Lease\nmetadata: {name: " + name + ", namespace: fencer-system, labels: {" + labels + "}}\nspec: {holderSelector: {matchLabels: {app: x}}}\n"
		if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	labelled := manifest("labelled", "fencer.io/lease: labelled, team: a")
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := toolErr("kubectl", "apply", "-f", labelled, "--warnings-as-errors")
		if err != nil && strings.Contains(err.Error(), "the fencer.io/lease label fences nothing on leases.fencer.io fencer-system/labelled") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a Lease labelled fencer.io/lease was applied without the warning: %v", err)
		}
		time.Sleep(time.Second)
	}
	tool(t, "kubectl", "get", "lease.fencer.io", "labelled", "-n", "fencer-system") // warned, not refused
	tool(t, "kubectl", "label", "lease.fencer.io", "labelled", "-n", "fencer-system", "team=b", "--overwrite", "--warnings-as-errors", asManager)
	tool(t, "kubectl", "apply", "-f", manifest("plain", "team: a"), "--warnings-as-errors")
	tool(t, "kubectl", "delete", "lease.fencer.io", "labelled", "plain", "-n", "fencer-system", "--wait=false")
}

// TestKustomizeOverlay: config/default builds with kubectl's kustomize and
// the real apiserver accepts every object (server-side dry run).
func TestKustomizeOverlay(t *testing.T) {
	if _, err := toolErr("kubectl", "get", "namespace", "fencer-system"); err != nil {
		tool(t, "kubectl", "create", "namespace", "fencer-system")
	}
	out := tool(t, "kubectl", "kustomize", filepath.Join(root, "config", "default"))
	for _, kind := range []string{"kind: Deployment", "kind: StatefulSet", "kind: ValidatingWebhookConfiguration", "kind: CustomResourceDefinition", "namespace: fencer-system"} {
		if !strings.Contains(out, kind) {
			t.Errorf("kustomize output lacks %q", kind)
		}
	}
	tool(t, "kubectl", "apply", "--dry-run=server", "-k", filepath.Join(root, "config", "default"))
}
