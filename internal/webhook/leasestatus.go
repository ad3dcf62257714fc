package webhook

import (
	"context"
	"fmt"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// LeaseStatusPath is where the manager serves the Lease status guard.
const LeaseStatusPath = "/validate-lease-status"

// LeaseStatusGuard lets only the fencer controller's own identity write the
// status of leases.fencer.io. The webhook never trusts that status (it reads
// live tokens from etcd), but workloads and the SDK read tokens from it, so a
// workload must not be able to mint itself one there. RBAC should already
// deny it; this holds even where RBAC is broad.
type LeaseStatusGuard struct {
	// Controller is the username the manager authenticates as.
	Controller string
}

// Handle allows a status write only from the controller.
func (g *LeaseStatusGuard) Handle(_ context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Update || req.SubResource != "status" || req.UserInfo.Username == g.Controller {
		return admission.Allowed("")
	}
	resp := admission.Denied(fmt.Sprintf("fencer: only the fencer controller (%s) may write the status of leases.fencer.io %s/%s; %s may not, since tokens there are read by workloads",
		g.Controller, req.Namespace, req.Name, req.UserInfo.Username))
	resp.Result.Code = http.StatusForbidden
	resp.Result.Reason = metav1.StatusReasonForbidden
	return resp
}

// WhoAmI asks the apiserver which username cfg authenticates as.
func WhoAmI(ctx context.Context, cfg *rest.Config) (string, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return "", err
	}
	r, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("asking the apiserver who fencer is (SelfSubjectReview): %w", err)
	}
	return r.Status.UserInfo.Username, nil
}
