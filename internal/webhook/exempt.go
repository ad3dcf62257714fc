package webhook

import (
	"strings"

	authenticationv1 "k8s.io/api/authentication/v1"
)

// DefaultExemptUsers are the lifecycle identities whose writes to fenced
// objects pass without a token, so that namespace deletion and garbage
// collection of dependents complete: kube-controller-manager's namespace
// controller and garbage collector (with --use-service-account-credentials,
// the default of kubeadm and most distributions), and the controller
// manager's own identity when it runs without per-controller credentials.
var DefaultExemptUsers = []string{
	"system:serviceaccount:kube-system:namespace-controller",
	"system:serviceaccount:kube-system:generic-garbage-collector",
	"system:kube-controller-manager",
}

// Exempt is the set of identities that pass every write to a fenced object:
// lifecycle controllers that cannot carry a token and must never be blocked.
type Exempt struct {
	Users  map[string]bool
	Groups map[string]bool
}

// NewExempt builds the set from usernames and group names; empty entries
// are ignored.
func NewExempt(users, groups []string) Exempt {
	return Exempt{Users: setOf(users), Groups: setOf(groups)}
}

func setOf(names []string) map[string]bool {
	m := map[string]bool{}
	for _, n := range names {
		if n = strings.TrimSpace(n); n != "" {
			m[n] = true
		}
	}
	return m
}

// Matches says whether u is exempt.
func (e Exempt) Matches(u authenticationv1.UserInfo) bool {
	if e.Users[u.Username] {
		return true
	}
	for _, g := range u.Groups {
		if e.Groups[g] {
			return true
		}
	}
	return false
}
