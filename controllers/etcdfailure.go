package controllers

import (
	"fmt"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/internal/etcdstore"
)

// etcdFailure is the condition reason and message for an etcd error: a
// full etcd (NOSPACE alarm) needs different action from an unreachable one.
func etcdFailure(err error) (reason, msg string) {
	if etcdstore.IsNoSpace(err) {
		return fencerv1.ReasonEtcdNoSpace, fmt.Sprintf("etcd is out of space (NOSPACE alarm), so nothing can be granted or claimed; the leading manager compacts, defragments and disarms it every --etcd-maintenance-interval, and docs/operations.md (\"etcd is full\") says what to do if that is not enough: %v", err)
	}
	return fencerv1.ReasonEtcdUnavailable, fmt.Sprintf("cannot reach etcd: %v", err)
}
