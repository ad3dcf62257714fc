package testenv

import (
	"context"
	"fmt"
	"path/filepath"

	authenticationv1 "k8s.io/api/authentication/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencer-io/fencer/test/support/manifest"
)

// Username is the user name c authenticates as, which the apiserver tells
// (SelfSubjectReview): the name InstallPolicies admits when given "".
func Username(ctx context.Context, c client.Client) (string, error) {
	me := &authenticationv1.SelfSubjectReview{}
	if err := c.Create(ctx, me); err != nil {
		return "", fmt.Errorf("asking the apiserver who the tests are (SelfSubjectReview): %w", err)
	}
	return me.Status.UserInfo.Username, nil
}

// InstallPolicies creates the chart's admission policies
// (manifest.Policies) with manager (a username) as the manager: the status
// guard admits only its status writes. When manager is "", it is c's own
// identity, which the tests' in-process managers share.
func InstallPolicies(ctx context.Context, c client.Client, manager string) error {
	root, err := RepoRoot()
	if err != nil {
		return err
	}
	if manager == "" {
		if manager, err = Username(ctx, c); err != nil {
			return err
		}
	}
	objs, err := manifest.Policies(filepath.Join(root, manifest.PoliciesFile), manager)
	if err != nil {
		return err
	}
	for _, obj := range objs {
		if err := c.Create(ctx, obj); err != nil {
			return fmt.Errorf("creating %s %s: %w", obj.GetKind(), obj.GetName(), err)
		}
	}
	return nil
}
