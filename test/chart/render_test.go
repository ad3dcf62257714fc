package chart

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/strvals"
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// render renders the chart with Helm's Go packages (loader, chartutil,
// engine), as `helm install` does, into objects. args are the variant's
// helm flags: --set, -f and --api-versions.
func render(t *testing.T, args ...string) []*unstructured.Unstructured {
	t.Helper()
	objs, err := renderGo(args...)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func renderGo(args ...string) ([]*unstructured.Unstructured, error) {
	files, err := renderFiles(args...)
	if err != nil {
		return nil, err
	}
	return parseRendered(files)
}

// renderFiles renders the chart into its files' text, by name.
func renderFiles(args ...string) (map[string]string, error) {
	ch, err := loader.Load(chartDir())
	if err != nil {
		return nil, err
	}
	vals := map[string]any{}
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = chartutil.KubeVersion{Version: "v1.37.2", Major: "1", Minor: "37"}
	for i := 0; i+1 < len(args); i += 2 {
		switch args[i] {
		case "--set":
			if err := strvals.ParseInto(args[i+1], vals); err != nil {
				return nil, fmt.Errorf("--set %s: %w", args[i+1], err)
			}
		case "-f": // a values file, read as helm reads one (numbers are float64)
			data, err := os.ReadFile(args[i+1])
			if err == nil {
				err = yaml.Unmarshal(data, &vals)
			}
			if err != nil {
				return nil, fmt.Errorf("-f %s: %w", args[i+1], err)
			}
		case "--api-versions":
			caps.APIVersions = append(caps.APIVersions, args[i+1])
		default:
			return nil, fmt.Errorf("renderGo does not know the flag %s", args[i])
		}
	}
	// Validates against values.schema.json, as helm does.
	top, err := chartutil.ToRenderValues(ch, vals, chartutil.ReleaseOptions{Name: "fencer", Namespace: "fencer-system", Revision: 1, IsInstall: true}, caps)
	if err != nil {
		return nil, err
	}
	return engine.Render(ch, top)
}

// parseRendered parses rendered files into objects, in helm template's
// order: by file name within the chart.
func parseRendered(files map[string]string) ([]*unstructured.Unstructured, error) {
	var objs []*unstructured.Unstructured
	for _, name := range slices.Sorted(maps.Keys(files)) {
		if !strings.HasSuffix(name, ".yaml") {
			continue // NOTES.txt and helpers
		}
		for _, doc := range strings.Split(files[name], "\n---") {
			m := map[string]any{}
			if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
				return nil, fmt.Errorf("%s: %w\n%s", name, err, doc)
			}
			if len(m) > 0 {
				objs = append(objs, &unstructured.Unstructured{Object: m})
			}
		}
	}
	return objs, nil
}

// helmTemplate returns the objects the helm binary renders for args.
func helmTemplate(t *testing.T, args ...string) []*unstructured.Unstructured {
	t.Helper()
	out := tool(t, "helm", append([]string{"template", "fencer", chartDir(), "--namespace", "fencer-system"}, args...)...)
	var objs []*unstructured.Unstructured
	for _, doc := range strings.Split(out, "\n---") {
		m := map[string]any{}
		if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
			t.Fatalf("rendered YAML: %v\n%s", err, doc)
		}
		if len(m) > 0 {
			objs = append(objs, &unstructured.Unstructured{Object: m})
		}
	}
	return objs
}

// TestGoRenderingMatchesHelm: the Go rendering the unit tests assert on is
// what the helm binary renders for users, object for object, in every
// variant.
func TestGoRenderingMatchesHelm(t *testing.T) {
	key := func(o *unstructured.Unstructured) string {
		return o.GetKind() + "/" + o.GetNamespace() + "/" + o.GetName()
	}
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			byKey := map[string]*unstructured.Unstructured{}
			for _, o := range render(t, v.args...) {
				byKey[key(o)] = o
			}
			bin := helmTemplate(t, v.args...)
			if len(bin) != len(byKey) {
				t.Fatalf("helm renders %d objects, the Go packages %d", len(bin), len(byKey))
			}
			for _, o := range bin {
				g, ok := byKey[key(o)]
				if !ok {
					t.Fatalf("helm renders %s; the Go packages do not", key(o))
				}
				gy, _ := yaml.Marshal(g.Object)
				hy, _ := yaml.Marshal(o.Object)
				if string(gy) != string(hy) {
					t.Fatalf("%s differs:\nhelm:\n%s\nGo:\n%s", key(o), hy, gy)
				}
			}
		})
	}
}

// TestSchemaRefusesBadValues: the strict values.schema.json refuses typos
// and wrong types through Helm's own validation, and the templates a label
// that would fence fencer's own objects, each with a message naming the
// value.
func TestSchemaRefusesBadValues(t *testing.T) {
	for _, c := range []struct{ set, want string }{
		{"replicaCount=0", "replicaCount"},
		{"replicas=2", "replicas"},
		{"webhook.failurePolicy=Sometimes", "failurePolicy"},
		{"webhook.timeoutSeconds=60", "timeoutSeconds"},
		{"kubeAPI.qps=0", "qps"},
		{"leaseWorkers=0", "leaseWorkers"},
		// Verbosities past what zap keeps: 129 and up would log nothing.
		{"logLevel=129", "logLevel"},
		{"logLevel=200", "logLevel"},
		{"logLevel=99999999999999999999", "logLevel"},
		// Secret names no Secret can have: the manager would fail at start.
		{"etcd.pkiSecret=Bad_CA", "pkiSecret"},
		{"etcd.tlsSecret=etcd/client", "tlsSecret"},
		// fencer's own objects must never be fenced.
		{`commonLabels.fencer\.io/lease=x`, "commonLabels sets the label fencer.io/lease"},
		{`podLabels.fencer\.io/lease=x`, "podLabels sets the label fencer.io/lease"},
		{`metrics.dashboard.labels.fencer\.io/lease=x`, "metrics.dashboard.labels sets the label fencer.io/lease"},
		// Names too long for the backup CronJob (52) and the etcd pods' hash label.
		{"fullnameOverride=" + strings.Repeat("f", 41), "at most 40 fit (the backup CronJob"},
		{"nameOverride=" + strings.Repeat("n", 34), "at most 40 fit"},
		{"fullnameOverride=" + strings.Repeat("f", 51), "fullnameOverride"},
		// A PodDisruptionBudget that would block every drain.
		{"replicaCount=1", "podDisruptionBudget.minAvailable (1) leaves none of the 1 replicas free to evict"},
		{"podDisruptionBudget.minAvailable=2", "podDisruptionBudget.minAvailable (2) leaves none of the 2 replicas free to evict"},
		{"podDisruptionBudget.minAvailable=100%", "podDisruptionBudget.minAvailable (100%) leaves none of the 2 replicas"},
		{"podDisruptionBudget.minAvailable= 2", "minAvailable"},
		{"podDisruptionBudget.minAvailable=+2", "minAvailable"},
		// The lifecycle identities dropped: namespace deletion would hang.
		{"webhook.exemptUsers=null", "exempt neither the namespace controller's"},
		{"webhook.exemptUsers={}", "exemptUsers"},
		{"webhook.exemptUsers={someone}", "exempt neither the namespace controller's"},
		{"webhook.exemptUsers={system:serviceaccount:kube-system:namespace-controller}", "exempt neither"},
		// A group that cannot hold the lifecycle controllers.
		{"webhook.exemptUsers={ci-bot},webhook.exemptGroups={team-admins}", "exempt neither"},
		{"webhook.exemptUsers={ci-bot},webhook.exemptGroups={system:authenticated}", "webhook.exemptGroups names system:authenticated"},
		// A group every workload is in: the fence would hold against no one.
		{"webhook.exemptGroups={system:serviceaccounts:kube-system,system:authenticated}", "webhook.exemptGroups names system:authenticated"},
		{"webhook.exemptGroups={ system:serviceaccounts}", "webhook.exemptGroups names system:serviceaccounts:"},
		{"webhook.exemptGroups={system:unauthenticated}", "webhook.exemptGroups names system:unauthenticated"},
		// The webhook's client CA ConfigMap must be a name.
		{"webhook.clientCA.configMap=Bad_CA", "configMap"},
		// A leading zero: sprig's int reads 08 as octal (0), YAML as 8.
		{"podDisruptionBudget.minAvailable=08", "minAvailable"},
		{"podDisruptionBudget.minAvailable=099%", "minAvailable"},
		// A namespace served but never sent to the webhooks.
		{"namespaces={team-a,kube-system}", `namespace "kube-system" is in namespaces and in webhook.excludeNamespaces`},
		// What the manager would refuse at start, crash-looping after an
		// install that reported success.
		{"logLevel=warn", "logLevel"},
		{"logLevel=0", "logLevel"},
		{"leaderElection.leaseDuration=2s", "leaderElection: leaseDuration (2s) must be more than renewDeadline (3s)"},
		{"leaderElection.leaseDuration=1m,leaderElection.renewDeadline=1m", "leaseDuration (1m) must be more than renewDeadline (1m)"},
		{"leaderElection.retryPeriod=2500ms", "renewDeadline more than 1.2 times retryPeriod (2500ms)"},
		{"webhook.port=8443", "metrics.port and webhook.port are both port 8443"},
		{"metrics.port=8081", "metrics.port and the probes' port are both port 8081"},
		{"etcd.endpoints={https://etcd:2379},etcd.enableAuth=true", "etcd.enableAuth needs an identity with the root role"},
		// TLS set up, and an endpoint the etcd client would send plain text.
		{"etcd.endpoints={https://etcd-0:2379,http://etcd-1:2379},etcd.tlsSecret=tls", "etcd.endpoints names http://etcd-1:2379, but etcd.tlsSecret"},
		{"etcd.endpoints={http://etcd:2379},etcd.pkiSecret=ca", "Write https://etcd:2379"},
	} {
		_, err := renderGo("--set", c.set)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("--set %s: got %v, want a schema error naming %s", c.set, err, c.want)
		}
	}
}

// The deprecated leaseFinalizerPolicy value is accepted (a release that
// set it upgrades with --reuse-values) and renders nothing: fencer puts no
// finalizer on Leases any more.
func TestLeaseFinalizerPolicyIsIgnored(t *testing.T) {
	all := render(t, "--api-versions", "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy", "--set", "leaseFinalizerPolicy.enabled=true")
	if n := len(find(all, "MutatingAdmissionPolicy")) + len(find(all, "MutatingAdmissionPolicyBinding")); n != 0 {
		t.Errorf("rendered %d MutatingAdmissionPolicy objects; the value is deprecated and ignored", n)
	}
}

// extraExemptUsers adds to the lifecycle identities; setting exemptUsers
// would replace them (Helm replaces lists), and namespace deletion would
// then hang on the webhook's refusals.
func TestExtraExemptUsersKeepTheLifecycleIdentities(t *testing.T) {
	var d appsv1.Deployment
	one(t, render(t, "--set", "webhook.extraExemptUsers={system:serviceaccount:apps:hpa}"), "Deployment", &d)
	want := "--exempt-users=system:serviceaccount:kube-system:namespace-controller,system:serviceaccount:kube-system:generic-garbage-collector,system:kube-controller-manager,system:serviceaccount:apps:hpa"
	for _, a := range d.Spec.Template.Spec.Containers[0].Args {
		if strings.HasPrefix(a, "--exempt-users=") {
			if a != want {
				t.Fatalf("%s\nwant %s", a, want)
			}
			return
		}
	}
	t.Fatal("no --exempt-users argument")
}

// What values-check.yaml allows at each of its bounds still renders.
func TestValuesChecksPassTheirBounds(t *testing.T) {
	render(t, "--set", "fullnameOverride="+strings.Repeat("f", 40))
	render(t, "--set", "fullnameOverride="+strings.Repeat("f", 47), "--set", "etcd.backup.enabled=false")
	render(t, "--set", "fullnameOverride="+strings.Repeat("f", 50), "--set", "etcd.endpoints={https://etcd:2379}")
	render(t, "--set", "replicaCount=3", "--set", "podDisruptionBudget.minAvailable=50%")
	render(t, "--set", "replicaCount=1", "--set", "podDisruptionBudget.enabled=false")
	render(t, "--set", "namespaces={team-a}")
	// The lifecycle identities through extraExemptUsers, or through groups.
	render(t, "--set", "webhook.exemptUsers=null", "--set", "webhook.extraExemptUsers={system:serviceaccount:kube-system:namespace-controller,system:serviceaccount:kube-system:generic-garbage-collector,system:kube-controller-manager}")
	render(t, "--set", "webhook.exemptUsers={someone}", "--set", "webhook.exemptGroups={system:serviceaccounts:kube-system}")
	// One entry holding two groups, as the manager splits it.
	values := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(values, []byte("webhook:\n  exemptUsers: [someone]\n  exemptGroups: [\"ops, system:serviceaccounts:kube-system\"]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	render(t, "-f", values)
	// docs/webhook.md: the two service accounts alone (with
	// --use-service-account-credentials), or the controller manager's own
	// identity alone (without it, the lifecycle controllers write as it).
	render(t, "--set", "webhook.exemptUsers={system:serviceaccount:kube-system:namespace-controller,system:serviceaccount:kube-system:generic-garbage-collector}")
	render(t, "--set", "webhook.exemptUsers={system:kube-controller-manager,ci-bot}")
	// Log levels and leader-election durations the manager takes.
	render(t, "--set", "logLevel=debug")
	render(t, "--set", "logLevel=Info") // the manager reads it in any case
	render(t, "--set", "logLevel=3")
	render(t, "--set", "logLevel=128")
	render(t, "--set", "logLevel=99")
	render(t, "--set", "leaderElection.leaseDuration=3001ms", "--set", "leaderElection.retryPeriod=2499ms")
	render(t, "--set", "leaderElection.leaseDuration=1m30s", "--set", "leaderElection.renewDeadline=1m29.5s", "--set", "leaderElection.retryPeriod=1m")
	render(t, "--set", "webhook.port=8444")
	// Plain etcd without TLS; auth with an identity.
	render(t, "--set", "etcd.endpoints={http://etcd:2379}")
	render(t, "--set", "etcd.endpoints={https://etcd:2379}", "--set", "etcd.enableAuth=true", "--set", "etcd.tlsSecret=tls")
}

// A values file's number is a float64: a large minAvailable must still
// render as an integer (not 1e+06, which the API server refuses).
func TestLargeMinAvailableRendersAsAnInteger(t *testing.T) {
	values := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(values, []byte("replicaCount: 1000001\npodDisruptionBudget:\n  minAvailable: 1000000\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	files, err := renderFiles("-f", values)
	if err != nil {
		t.Fatal(err)
	}
	// The text, since YAML reads 1e+06 as the same number.
	if pdb := files["fencer/templates/deployment.yaml"]; !strings.Contains(pdb, "minAvailable: 1000000\n") {
		t.Errorf("minAvailable does not render as the integer 1000000:\n%s", pdb)
	}
}
