package controllers

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
)

func TestEtcdFailureTellsAFullEtcdFromAnUnreachableOne(t *testing.T) {
	reason, msg := etcdFailure(fmt.Errorf("granting default/report: %w", rpctypes.ErrNoSpace))
	if reason != fencerv1.ReasonEtcdNoSpace || !strings.Contains(msg, "docs/operations.md") {
		t.Errorf("NOSPACE: got %s %q", reason, msg)
	}
	reason, _ = etcdFailure(errors.New("context deadline exceeded"))
	if reason != fencerv1.ReasonEtcdUnavailable {
		t.Errorf("timeout: got %s", reason)
	}
}
