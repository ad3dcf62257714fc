package metrics

import (
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// The secure metrics endpoint asks the API server who a scraper is
// (TokenReview) and whether it may get /metrics (SubjectAccessReview).
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// ServerOptions configures the manager's metrics endpoint on addr. Secure
// serves HTTPS and admits only a bearer token whose user may get the
// non-resource URL /metrics, the way kube-controller-manager and Kueue do:
// metrics name every namespace with an IDRange and say how the install is
// doing, which is not for every pod in the cluster to read. The certificate
// is tls.crt and tls.key in certDir, reloaded when they change; with no
// certDir, or none there yet, a self-signed one.
func ServerOptions(addr string, secure bool, certDir string) metricsserver.Options {
	opts := metricsserver.Options{BindAddress: addr}
	if !secure || addr == "0" {
		return opts
	}
	opts.SecureServing = true
	opts.CertDir = certDir
	opts.FilterProvider = filters.WithAuthenticationAndAuthorization
	return opts
}
