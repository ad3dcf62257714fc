// Package webhook tests the fencing webhook installed in a real kube-apiserver
// (envtest), with the Lease controller granting in a real etcd.
package webhook

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/internal/metrics"
	"github.com/fencer-io/fencer/pkg/fence"
	"github.com/fencer-io/fencer/test/support/framework"
)

var fx *framework.Fencer

func TestMain(m *testing.M) {
	var err error
	// The opt-in Lease deletion webhook too (leasedelete_test.go).
	if fx, err = framework.StartFencerReleasingAtDelete(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	fx.Stop()
	os.Exit(code)
}

// setup starts a controller, two Ready candidates and a Lease, and returns
// the namespace and the first grant's holder and token.
func setup(t *testing.T, mutate func(*fencerv1.Lease)) (ns, holder string, tok int64) {
	t.Helper()
	return setupIn(t, "", mutate)
}

// setupIn is setup in namespace ns, or in a new one when ns is "".
func setupIn(t *testing.T, ns string, mutate func(*fencerv1.Lease)) (string, string, int64) {
	t.Helper()
	fx.StartController(t, "c1")
	if ns == "" {
		ns = fx.Namespace(t)
	}
	fx.ReadyPod(t, ns, "w-0", "w", "")
	fx.ReadyPod(t, ns, "w-1", "w", "")
	l := &fencerv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "report", Namespace: ns},
		Spec:       fencerv1.LeaseSpec{TTLSeconds: 2, HolderSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "w"}}},
	}
	if mutate != nil {
		mutate(l)
	}
	if err := fx.Client.Create(context.Background(), l); err != nil {
		t.Fatal(err)
	}
	holder, tok := held(t, ns, "")
	return ns, holder, tok
}

// held waits until the Lease is held by someone other than not.
func held(t *testing.T, ns, not string) (string, int64) {
	t.Helper()
	var l fencerv1.Lease
	framework.Eventually(t, 60*time.Second, "lease held", func() error {
		if err := fx.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "report"}, &l); err != nil {
			return err
		}
		if l.Status.Token == 0 || l.Status.Holder == not {
			return fmt.Errorf("holder %q token %d", l.Status.Holder, l.Status.Token)
		}
		return nil
	})
	return l.Status.Holder, l.Status.Token
}

// failOver marks the holder pod unready and waits for the Lease's next
// grant, to another pod: its holder and token.
func failOver(t *testing.T, ns, holder string) (string, int64) {
	t.Helper()
	pod := &corev1.Pod{}
	if err := fx.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: holder}, pod); err != nil {
		t.Fatal(err)
	}
	fx.SetReady(t, pod, false)
	return held(t, ns, holder)
}

func configMap(ns, lease, tok string) *corev1.ConfigMap {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "out", Namespace: ns, Labels: map[string]string{}, Annotations: map[string]string{}}}
	if lease != "" {
		cm.Labels["fencer.io/lease"] = lease
	}
	if tok != "" {
		cm.Annotations["fencer.io/token"] = tok
	}
	return cm
}

// write updates the fenced ConfigMap with tok (and data), as a holder would.
func write(c client.Client, ns string, tok int64, data string) error {
	cm := &corev1.ConfigMap{}
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "out"}, cm); err != nil {
		return err
	}
	cm.Annotations["fencer.io/token"] = strconv.FormatInt(tok, 10)
	cm.Data = map[string]string{"v": data}
	return c.Update(context.Background(), cm)
}

// refused checks err is fencer's 409 carrying want.
func refused(t *testing.T, err error, want string) {
	t.Helper()
	if err == nil {
		t.Fatalf("write accepted; want it refused with %q", want)
	}
	if !apierrors.IsConflict(err) || !strings.Contains(err.Error(), want) {
		t.Fatalf("want a 409 containing %q, got %v", want, err)
	}
}

// refusedAs checks err is fencer's 409 whose causes name reason, read as
// the SDK reads them, and whose message carries want.
func refusedAs(t *testing.T, err error, reason fencerv1.DenialReason, want string) fence.StaleTokenError {
	t.Helper()
	if reason == fencerv1.DenialTokenless {
		// No token could make it pass: 403, so kubectl does not retry it.
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), want) {
			t.Fatalf("want a 403 containing %q, got %v", want, err)
		}
	} else {
		refused(t, err, want)
	}
	var st *fence.StaleTokenError
	if !errors.As(fence.AsStaleToken(err), &st) || st.Reason != reason {
		t.Fatalf("want causes with reason %s, got %+v from %v", reason, st, err)
	}
	return *st
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func TestLiveTokenPassesStaleIsRefusedAfterFailover(t *testing.T) {
	ns, holder, tok := setup(t, nil)
	ctx := context.Background()
	if err := fx.Client.Create(ctx, configMap(ns, "report", itoa(tok))); err != nil {
		t.Fatalf("create with the live token: %v", err)
	}
	if err := write(fx.Client, ns, tok, "a"); err != nil {
		t.Fatalf("update with the live token: %v", err)
	}

	next, tok2 := failOver(t, ns, holder)
	if tok2 <= tok {
		t.Fatalf("token did not grow: %d -> %d", tok, tok2)
	}
	// The Lease's status already records tok2, so the webhook refuses
	// without reading etcd.
	refused(t, write(fx.Client, ns, tok, "stale"),
		fmt.Sprintf("fencer: stale token %d for lease %s/report: token %d has been issued since, as the Lease's status records [lease %s/report; offered token \"%d\"; recorded token \"%d\"; current token %d; holder %s]",
			tok, ns, tok2, ns, tok, tok, tok2, next))
	if err := write(fx.Client, ns, tok2, "b"); err != nil {
		t.Fatalf("update with the new live token: %v", err)
	}
	// The old holder's token is now below the object's too.
	refused(t, write(fx.Client, ns, tok, "stale again"), "stale token")

	// Removing the label with the stale token is a write like any other.
	cm := &corev1.ConfigMap{}
	if err := fx.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "out"}, cm); err != nil {
		t.Fatal(err)
	}
	delete(cm.Labels, "fencer.io/lease")
	cm.Annotations["fencer.io/token"] = itoa(tok)
	refused(t, fx.Client.Update(ctx, cm), "stale token")
	// A DELETE cannot carry a token: even the live holder must unfence first.
	refusedAs(t, fx.Client.Delete(ctx, configMap(ns, "", "")), fencerv1.DenialTokenless, "a DELETE cannot carry a fencing token")
	if err := fence.NewClient(fx.Client, fence.Token{Lease: "report", Value: tok2}).Unfence(ctx, configMap(ns, "", "")); err != nil {
		t.Fatalf("unfencing with the live token: %v", err)
	}
	if err := fx.Client.Delete(ctx, configMap(ns, "", "")); err != nil {
		t.Fatalf("delete of an unfenced object: %v", err)
	}
}

func TestForgedMissingMalformedAndLowering(t *testing.T) {
	ns, _, tok := setup(t, nil)
	ctx := context.Background()
	refused(t, fx.Client.Create(ctx, configMap(ns, "report", itoa(tok+1_000_000))), "forged token")
	refused(t, fx.Client.Create(ctx, configMap(ns, "report", "")), fmt.Sprintf("fencer: this write sends no fencing token for lease %s/report", ns))
	refused(t, fx.Client.Create(ctx, configMap(ns, "report", "0x2a")), `fencer: malformed fencing token "0x2a"`)
	refused(t, fx.Client.Create(ctx, configMap(ns, "ghost", itoa(tok))), fmt.Sprintf("lease %s/ghost does not exist", ns))

}

// TestUnfencedObjectsNeverReachTheWebhook counts the webhook's decisions
// around writes of unlabeled objects.
func TestUnfencedObjectsNeverReachTheWebhook(t *testing.T) {
	ns, _, tok := setup(t, nil)
	ctx := context.Background()
	total := func() float64 {
		var sum float64
		for _, op := range []string{"CREATE", "UPDATE", "DELETE"} {
			for _, res := range []string{"allowed", "refused"} {
				for _, reason := range []string{"Allowed", "NotFenced", "MissingToken", "TokenlessWrite"} {
					sum += testutil.ToFloat64(metrics.AdmissionDecisions.WithLabelValues(op, res, reason))
				}
			}
		}
		return sum
	}
	start := total()
	cm := configMap(ns, "", "")
	if err := fx.Client.Create(ctx, cm); err != nil {
		t.Fatal(err)
	}
	cm.Data = map[string]string{"x": "y"}
	if err := fx.Client.Update(ctx, cm); err != nil {
		t.Fatal(err)
	}
	if err := fx.Client.Delete(ctx, cm); err != nil {
		t.Fatal(err)
	}
	if got := total(); got != start {
		t.Fatalf("unfenced writes reached the webhook: decisions went from %v to %v", start, got)
	}
	// The counter does move for a fenced write, so the check above can fail.
	if err := fx.Client.Create(ctx, configMap(ns, "report", itoa(tok))); err != nil {
		t.Fatal(err)
	}
	if got := total(); got != start+1 {
		t.Fatalf("a fenced write counted %v decisions, want 1", got-start)
	}
}

// TestFencedCustomResource: any kind is fenced by the label, here a custom
// resource of a group whose name only ends in fencer.io (only fencer's
// own kinds are never fenced: ownkinds_test.go).
func TestFencedCustomResource(t *testing.T) {
	ns, _, tok := setup(t, nil)
	ctx := context.Background()
	u := &unstructured.Unstructured{Object: map[string]any{
		"metadata": map[string]any{"name": "custom", "namespace": ns,
			"labels":      map[string]any{"fencer.io/lease": "report"},
			"annotations": map[string]any{"fencer.io/token": itoa(tok - 1)}},
		"spec": map[string]any{"size": int64(3)},
	}}
	u.SetGroupVersionKind(looseCRD(t))
	refused(t, fx.Client.Create(ctx, u.DeepCopy()), "stale token")
	u.SetAnnotations(map[string]string{"fencer.io/token": itoa(tok)})
	if err := fx.Client.Create(ctx, u); err != nil {
		t.Fatalf("custom resource with the live token: %v", err)
	}
}

// TestBindIdentity: with bindIdentity only the holder pod's own bound
// service-account token may write; another pod's token is refused, even
// with the live token.
func TestBindIdentity(t *testing.T) {
	fx.StartController(t, "c1")
	ctx := context.Background()
	ns := fx.Namespace(t)
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "worker", Namespace: ns}}
	if err := fx.Client.Create(ctx, sa); err != nil {
		t.Fatal(err)
	}
	grantConfigMaps(t, ns, "worker")
	fx.ReadyPod(t, ns, "w-0", "w", "worker")
	fx.ReadyPod(t, ns, "w-1", "w", "worker")
	l := &fencerv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "report", Namespace: ns},
		Spec: fencerv1.LeaseSpec{TTLSeconds: 15, BindIdentity: true,
			HolderSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "w"}}},
	}
	if err := fx.Client.Create(ctx, l); err != nil {
		t.Fatal(err)
	}
	holder, tok := held(t, ns, "")
	other := "w-1"
	if holder == "w-1" {
		other = "w-0"
	}
	asHolder := podClient(t, ns, holder)
	asOther := podClient(t, ns, other)
	refused(t, asOther.Create(ctx, configMap(ns, "report", itoa(tok))),
		fmt.Sprintf("binds writes to its holder pod %s (bindIdentity); this request comes from system:serviceaccount:%s:worker (pod %s)", holder, ns, other))
	refused(t, fx.Client.Create(ctx, configMap(ns, "report", itoa(tok))), "binds writes to its holder pod")
	if err := asHolder.Create(ctx, configMap(ns, "report", itoa(tok))); err != nil {
		t.Fatalf("the holder pod's own identity was refused: %v", err)
	}
}

func grantConfigMaps(t *testing.T, ns, sa string) {
	t.Helper()
	ctx := context.Background()
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "cm", Namespace: ns},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"*"}}}}
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "cm", Namespace: ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "cm"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa, Namespace: ns}}}
	for _, o := range []client.Object{role, rb} {
		if err := fx.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
}

// podClient authenticates as the pod's service account with a token bound
// to the pod (TokenRequest), as the kubelet gives a pod.
func podClient(t *testing.T, ns, podName string) client.Client {
	t.Helper()
	ctx := context.Background()
	pod := &corev1.Pod{}
	if err := fx.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: podName}, pod); err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(fx.Config)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, pod.Spec.ServiceAccountName, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: ptr.To[int64](600),
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := rest.AnonymousClientConfig(fx.Config)
	cfg.BearerToken = tr.Status.Token
	c, err := client.New(cfg, client.Options{Scheme: fx.Env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestOnlyTheControllerWritesLeaseStatus: a workload with RBAC to write Lease
// status still cannot mint itself a token there, nor name, in a
// WorkloadLease's status, a CronJob run whose pods its member Lease would
// stay with; the controller's own status writes (every other test depends
// on them) pass.
func TestOnlyTheControllerWritesLeaseStatus(t *testing.T) {
	ns, _, tok := setup(t, nil)
	ctx := context.Background()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "rogue", Namespace: ns}}
	if err := fx.Client.Create(ctx, sa); err != nil {
		t.Fatal(err)
	}
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "lease-status", Namespace: ns},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"fencer.io"}, Resources: []string{"leases", "leases/status", "workloadleases", "workloadleases/status"}, Verbs: []string{"*"}}}}
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "lease-status", Namespace: ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "lease-status"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "rogue", Namespace: ns}}}
	for _, o := range []client.Object{role, rb} {
		if err := fx.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	fx.ReadyPod(t, ns, "rogue", "rogue", "rogue")
	rogue := podClient(t, ns, "rogue")
	err := framework.UpdateStatus(ctx, t, rogue, client.ObjectKey{Namespace: ns, Name: "report"}, &fencerv1.Lease{}, func(o client.Object) {
		l := o.(*fencerv1.Lease)
		l.Status.Token = tok + 100
		l.Status.Holder = "rogue"
	})
	if err == nil || !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "only the fencer manager") ||
		!strings.Contains(err.Error(), "rogue") || !strings.Contains(err.Error(), "workloads read their fencing tokens") {
		t.Fatalf("a workload wrote Lease status: %v", err)
	}
	wl := &fencerv1.WorkloadLease{ObjectMeta: metav1.ObjectMeta{Name: "nightly", Namespace: ns},
		Spec: fencerv1.WorkloadLeaseSpec{Workload: fencerv1.WorkloadRef{Kind: fencerv1.WorkloadCronJob, Name: "nightly"}}}
	if err := rogue.Create(ctx, wl); err != nil {
		t.Fatal(err)
	}
	err = framework.UpdateStatus(ctx, t, rogue, client.ObjectKeyFromObject(wl), &fencerv1.WorkloadLease{}, func(o client.Object) {
		o.(*fencerv1.WorkloadLease).Status.CronJobRun = &fencerv1.CronJobRun{LeaseUID: "any", JobUID: "forged", Order: "99999999999999999999/forged"}
	})
	if err == nil || !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "workloadleases.fencer.io "+ns+"/nightly") ||
		!strings.Contains(err.Error(), "status.cronJobRun names the run") {
		t.Fatalf("a workload wrote WorkloadLease status: %v", err)
	}
}
