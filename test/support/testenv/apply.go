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
// (SelfSubjectReview): the name InstallStatusGuard admits when given "".
func Username(ctx context.Context, c client.Client) (string, error) {
	me := &authenticationv1.SelfSubjectReview{}
	if err := c.Create(ctx, me); err != nil {
		return "", fmt.Errorf("asking the apiserver who the tests are (SelfSubjectReview): %w", err)
	}
	return me.Status.UserInfo.Username, nil
}

// InstallStatusGuard creates the chart's status guard (manifest.StatusGuard)
// admitting only the status writes of manager (a username), or, when
// manager is "", of c's own identity, which the tests' in-process managers
// share.
func InstallStatusGuard(ctx context.Context, c client.Client, manager string) error {
	root, err := RepoRoot()
	if err != nil {
		return err
	}
	if manager == "" {
		if manager, err = Username(ctx, c); err != nil {
			return err
		}
	}
	objs, err := manifest.StatusGuard(filepath.Join(root, manifest.StatusGuardFile), manager)
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
