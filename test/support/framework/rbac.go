package framework

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/fencer-io/fencer/test/support/testenv"
)

// BindGeneratedRole creates service account ns/sa and binds it to nothing
// but the generated config/rbac/role.yaml: its ClusterRole cluster-wide and
// its Role in ns, both renamed to name. Objects that exist are kept.
func BindGeneratedRole(ctx context.Context, cl client.Client, ns, sa, name string) error {
	root, err := testenv.RepoRoot()
	if err != nil {
		return err
	}
	raw, err := os.ReadFile(filepath.Join(root, "config", "rbac", "role.yaml"))
	if err != nil {
		return err
	}
	subject := []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa, Namespace: ns}}
	objs := []client.Object{&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa, Namespace: ns}}}
	for _, doc := range strings.Split(string(raw), "\n---\n") {
		var meta struct{ Kind string }
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			return err
		}
		switch meta.Kind {
		case "ClusterRole":
			r := &rbacv1.ClusterRole{}
			if err := yaml.Unmarshal([]byte(doc), r); err != nil {
				return err
			}
			r.Name = name
			objs = append(objs, r, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
				RoleRef: rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: name}, Subjects: subject})
		case "Role":
			r := &rbacv1.Role{}
			if err := yaml.Unmarshal([]byte(doc), r); err != nil {
				return err
			}
			r.Name, r.Namespace = name, ns
			objs = append(objs, r, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
				RoleRef: rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: name}, Subjects: subject})
		}
	}
	for _, o := range objs {
		if err := cl.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("%T %s: %w", o, o.GetName(), err)
		}
	}
	return nil
}

// ServiceAccountKubeconfig writes to path a kubeconfig for the apiserver
// of cfg that authenticates as ns/sa with a TokenRequest token. With pod
// set, the token is bound to the pod, as the kubelet mounts it: the
// apiserver then names the pod in the request's userInfo.extra.
func ServiceAccountKubeconfig(ctx context.Context, cfg *rest.Config, ns, sa string, pod *corev1.Pod, path string) error {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	spec := authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}
	if pod != nil {
		spec.BoundObjectRef = &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}
	}
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{Spec: spec}, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["c"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["sa"] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	kc.Contexts["sa"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "sa"}
	kc.CurrentContext = "sa"
	return clientcmd.WriteToFile(*kc, path)
}
