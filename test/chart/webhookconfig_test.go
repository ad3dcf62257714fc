package chart

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// webhooksOf returns each webhook of the Mutating and Validating
// configurations in objs, by name, without what is install-specific: the
// configuration's name and the service the client calls (its name, its
// namespace and the CA). The path it calls, the rules, selectors, match
// conditions and failure policy are what decide which writes are judged
// and how, and must not differ between an install and make dev.
func webhooksOf(t *testing.T, objs []*unstructured.Unstructured) map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]any{}
	for _, o := range objs {
		if o.GetKind() != "MutatingWebhookConfiguration" && o.GetKind() != "ValidatingWebhookConfiguration" {
			continue
		}
		hooks, _, _ := unstructured.NestedSlice(o.Object, "webhooks")
		for _, h := range hooks {
			hook := h.(map[string]any)
			name := o.GetKind() + "/" + hook["name"].(string)
			path, _, _ := unstructured.NestedString(hook, "clientConfig", "service", "path")
			hook = deepCopy(hook)
			delete(hook, "clientConfig")
			hook["path"] = path
			normalizeNamespaces(hook)
			out[name] = hook
		}
	}
	return out
}

func deepCopy(m map[string]any) map[string]any {
	return (&unstructured.Unstructured{Object: m}).DeepCopy().Object
}

// normalizeNamespaces sorts the values of namespace selector expressions,
// whose order means nothing.
func normalizeNamespaces(hook map[string]any) {
	exprs, _, _ := unstructured.NestedSlice(hook, "namespaceSelector", "matchExpressions")
	for _, e := range exprs {
		m := e.(map[string]any)
		if vs, ok := m["values"].([]any); ok {
			slices.SortFunc(vs, func(a, b any) int {
				switch {
				case a.(string) < b.(string):
					return -1
				case a.(string) > b.(string):
					return 1
				}
				return 0
			})
		}
	}
}

// The webhook configuration of make dev, the integration tests and the
// fault run (config/webhook/manifests.yaml) is the chart's, rendered with
// no values into fencer-system: the same webhooks, rules, selectors, match
// conditions and failure policies. The two are written by hand, so this
// test is what keeps them one: a fenced object in fencer's own namespace
// once took tokenless writes under make dev while the chart judged it.
func TestDevWebhooksMatchTheChart(t *testing.T) {
	dev := readConfig(t, "config/webhook")
	devHooks := webhooksOf(t, dev)
	chartHooks := webhooksOf(t, render(t))
	if len(devHooks) == 0 {
		t.Fatal("config/webhook/manifests.yaml has no webhooks")
	}
	for name, want := range chartHooks {
		got, ok := devHooks[name]
		if !ok {
			t.Errorf("%s: in the chart, missing from config/webhook/manifests.yaml", name)
			continue
		}
		for _, field := range fieldsOf(want, got) {
			if !reflect.DeepEqual(want[field], got[field]) {
				t.Errorf("%s: %s differs:\n chart:  %v\n config: %v", name, field, want[field], got[field])
			}
		}
	}
	for name := range devHooks {
		if _, ok := chartHooks[name]; !ok {
			t.Errorf("%s: in config/webhook/manifests.yaml, not in the chart", name)
		}
	}
}

func fieldsOf(a, b map[string]any) []string {
	var out []string
	for k := range a {
		out = append(out, k)
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// readConfig reads <dir>/manifests.yaml, dir relative to the repository.
func readConfig(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(chartDir(), "..", "..", dir, "manifests.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var dev []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096)
	for {
		m := map[string]any{}
		if err := dec.Decode(&m); err != nil {
			break
		}
		if len(m) > 0 {
			dev = append(dev, &unstructured.Unstructured{Object: m})
		}
	}
	return dev
}

// The opt-in Lease deletion webhook and the manager's finalizer namespaces
// cover every namespace between them: where the webhook does not receive a
// Lease's DELETE (webhook.excludeNamespaces), the manager puts the
// finalizer on its Leases instead. The webhook always fails closed: a
// Lease let go unanswered would leave its grant alive.
func TestLeaseDeleteWebhookAndFinalizerNamespacesMeet(t *testing.T) {
	if n := len(webhooksOf(t, render(t))); n == 0 || webhooksOf(t, render(t))["ValidatingWebhookConfiguration/lease-delete.fencer.io"] != nil {
		t.Fatalf("the default install renders %d webhooks, lease-delete.fencer.io among them; it is opt-in", n)
	}
	// The tests' copy of the opt-in webhook is the chart's.
	want := webhooksOf(t, render(t, "--set", "leaseDeletion.webhook=true"))["ValidatingWebhookConfiguration/lease-delete.fencer.io"]
	got := webhooksOf(t, readConfig(t, "test/support/testenv/leasedeletewebhook"))["ValidatingWebhookConfiguration/lease-delete.fencer.io"]
	if !reflect.DeepEqual(want, got) {
		t.Errorf("test/support/testenv/leasedeletewebhook differs from the chart's:\n chart:  %v\n config: %v", want, got)
	}
	objs := render(t, "--set", "leaseDeletion.webhook=true", "--set", "webhook.excludeNamespaces={kube-system,batch}", "--set", "webhook.failurePolicy=Ignore")
	hook, ok := webhooksOf(t, objs)["ValidatingWebhookConfiguration/lease-delete.fencer.io"]
	if !ok {
		t.Fatal("no lease-delete.fencer.io webhook")
	}
	if hook["failurePolicy"] != "Fail" || hook["sideEffects"] != "NoneOnDryRun" {
		t.Errorf("lease-delete.fencer.io: failurePolicy %v, sideEffects %v; want Fail, NoneOnDryRun", hook["failurePolicy"], hook["sideEffects"])
	}
	sel, _, _ := unstructured.NestedSlice(hook, "namespaceSelector", "matchExpressions")
	if got := fmt.Sprint(sel); !strings.Contains(got, "values:[kube-system batch]") || strings.Contains(got, "fencer-system") {
		t.Errorf("lease-delete.fencer.io skips %s; want exactly kube-system and batch", got)
	}
	var dep appsv1.Deployment
	one(t, objs, "Deployment", &dep)
	if args := strings.Join(dep.Spec.Template.Spec.Containers[0].Args, " "); !strings.Contains(args, "--lease-delete-webhook --lease-finalizer-namespaces=kube-system,batch") {
		t.Errorf("the manager's args %s lack --lease-delete-webhook --lease-finalizer-namespaces=kube-system,batch", args)
	}
	one(t, render(t), "Deployment", &dep)
	if args := strings.Join(dep.Spec.Template.Spec.Containers[0].Args, " "); strings.Contains(args, "--lease-delete-webhook") {
		t.Errorf("the default install's manager releases at the DELETE: %s", args)
	}
}

// networkPolicy.webhookFrom narrows the manager's webhook port to the
// peers given (the control plane's addresses), and leaves the metrics port
// as it was; by default every pod may reach both.
func TestWebhookPortCanBeNarrowed(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "[map[ports:[map[port:9443 protocol:TCP] map[port:8443 protocol:TCP]]]]"},
		{[]string{"--set", "networkPolicy.webhookFrom[0].ipBlock.cidr=10.0.0.0/24"},
			"[map[from:[map[ipBlock:map[cidr:10.0.0.0/24]]] ports:[map[port:9443 protocol:TCP]]] map[ports:[map[port:8443 protocol:TCP]]]]"},
	} {
		var got string
		for _, np := range find(render(t, tc.args...), "NetworkPolicy") {
			if strings.HasSuffix(np.GetName(), "-etcd") {
				continue
			}
			in, _, _ := unstructured.NestedSlice(np.Object, "spec", "ingress")
			got = fmt.Sprint(in)
		}
		if got != tc.want {
			t.Errorf("%v: the manager's ingress %s, want %s", tc.args, got, tc.want)
		}
	}
}

// The Lease finalizer webhook only saves the manager a write, so it never
// blocks a Lease's creation (Ignore, whatever webhook.failurePolicy says,
// and a short timeout), receives only Lease CREATEs, and is left out with
// leaseDeletion.webhook, where Leases carry the finalizer only in the
// namespaces the webhooks skip.
func TestLeaseFinalizerWebhook(t *testing.T) {
	const name = "MutatingWebhookConfiguration/lease-finalizer.fencer.io"
	hook, ok := webhooksOf(t, render(t, "--set", "webhook.failurePolicy=Fail"))[name]
	if !ok {
		t.Fatal("the default install has no lease-finalizer.fencer.io webhook")
	}
	if hook["failurePolicy"] != "Ignore" || fmt.Sprint(hook["timeoutSeconds"]) != "2" || hook["sideEffects"] != "None" {
		t.Errorf("lease-finalizer.fencer.io: failurePolicy %v, timeoutSeconds %v, sideEffects %v; want Ignore, 2, None", hook["failurePolicy"], hook["timeoutSeconds"], hook["sideEffects"])
	}
	rules, _, _ := unstructured.NestedSlice(hook, "rules")
	if got := fmt.Sprint(rules); got != "[map[apiGroups:[fencer.io] apiVersions:[*] operations:[CREATE] resources:[leases] scope:Namespaced]]" {
		t.Errorf("lease-finalizer.fencer.io rules %s; want only the CREATE of fencer.io leases", got)
	}
	if _, ok := webhooksOf(t, render(t, "--set", "leaseDeletion.webhook=true"))[name]; ok {
		t.Error("with leaseDeletion.webhook the chart still renders lease-finalizer.fencer.io")
	}
}

// webhook.clientCA mounts the ConfigMap and passes the manager the CA and
// names, so the webhook answers only the apiserver's certificate; unset,
// neither the flags nor the volume are rendered.
func TestWebhookClientCA(t *testing.T) {
	for _, tc := range []struct {
		args   []string
		flags  []string
		volume string
	}{
		{nil, nil, ""},
		{[]string{"--set", "webhook.clientCA.configMap=apiserver-webhook-ca"}, []string{"--webhook-client-ca-file=/etc/fencer/webhook-client-ca/ca.crt"}, "apiserver-webhook-ca"},
		{[]string{"--set", "webhook.clientCA.configMap=ca", "--set", "webhook.clientCA.key=bundle.pem", "--set", "webhook.clientCA.names={kube-apiserver,apiserver-proxy}"},
			[]string{"--webhook-client-ca-file=/etc/fencer/webhook-client-ca/bundle.pem", "--webhook-client-names=kube-apiserver,apiserver-proxy"}, "ca"},
	} {
		var dep appsv1.Deployment
		one(t, render(t, tc.args...), "Deployment", &dep)
		var got []string
		for _, a := range dep.Spec.Template.Spec.Containers[0].Args {
			if strings.HasPrefix(a, "--webhook-client-") {
				got = append(got, a)
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(tc.flags) {
			t.Errorf("%v: flags %v, want %v", tc.args, got, tc.flags)
		}
		var volume string
		for _, v := range dep.Spec.Template.Spec.Volumes {
			if v.Name == "webhook-client-ca" && v.ConfigMap != nil {
				volume = v.ConfigMap.Name
			}
		}
		mounted := false
		for _, m := range dep.Spec.Template.Spec.Containers[0].VolumeMounts {
			mounted = mounted || (m.Name == "webhook-client-ca" && m.MountPath == "/etc/fencer/webhook-client-ca" && m.ReadOnly)
		}
		if volume != tc.volume || mounted != (tc.volume != "") {
			t.Errorf("%v: volume from ConfigMap %q (mounted %v), want %q", tc.args, volume, mounted, tc.volume)
		}
	}
}
