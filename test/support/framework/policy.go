package framework

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// RefuseUpdates makes the apiserver refuse the updates of resource (as in
// rule) in ns for which the CEL expression is false ("false": every one), as a ValidatingAdmissionPolicy of the cluster's own might;
// the returned func lifts it. It returns once probe's update is refused by
// it.
func RefuseUpdates(t *testing.T, c client.Client, ns string, rule admissionregistrationv1.Rule, expression string, probe func(context.Context) error) (unblock func()) {
	t.Helper()
	ctx := context.Background()
	name := "refuse-updates-" + ns + "-" + strings.ReplaceAll(strings.Join(rule.Resources, "-"), "/", "-")
	const refused = "updates refused by the test"
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionregistrationv1.Fail),
			MatchConstraints: &admissionregistrationv1.MatchResources{
				ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
					RuleWithOperations: admissionregistrationv1.RuleWithOperations{
						Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Update},
						Rule:       rule,
					},
				}},
			},
			Validations: []admissionregistrationv1.Validation{{Expression: expression, Message: refused}},
		},
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        name,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
			MatchResources: &admissionregistrationv1.MatchResources{
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: ns}},
			},
		},
	}
	for _, obj := range []client.Object{policy, binding} {
		if err := c.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	unblock = func() {
		for _, obj := range []client.Object{binding, policy} {
			if err := client.IgnoreNotFound(c.Delete(ctx, obj)); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Cleanup(unblock)
	Eventually(t, 30*time.Second, "the policy refusing "+strings.Join(rule.Resources, ","), func() error {
		err := probe(ctx)
		switch {
		case err == nil:
			return fmt.Errorf("the probe update was allowed")
		case !strings.Contains(err.Error(), refused):
			return fmt.Errorf("the probe update failed, but not by the policy: %w", err)
		}
		return nil
	})
	return unblock
}

// RefusePodUpdates refuses the pod updates in probe's namespace for which
// expression is false (RefuseUpdates), and returns once an update of probe
// is refused.
func RefusePodUpdates(t *testing.T, c client.Client, probe client.ObjectKey, expression string) (unblock func()) {
	t.Helper()
	rule := admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}}
	return RefuseUpdates(t, c, probe.Namespace, rule, expression, func(ctx context.Context) error {
		p := &corev1.Pod{}
		if err := c.Get(ctx, probe, p); err != nil {
			return err
		}
		patch := client.MergeFrom(p.DeepCopy())
		p.Annotations = map[string]string{"test/probe": time.Now().String()}
		return c.Patch(ctx, p, patch)
	})
}
