package controllers

import (
	"context"
	"strings"
	"testing"

	"github.com/go-logr/logr/funcr"
	ctrl "sigs.k8s.io/controller-runtime"
)

// TestAMissingIdentityNamespaceIsLoggedOnce checks that an
// --identity-namespaces entry with no namespace object is reported, so a
// misspelt name does not go unnoticed, and only once, though it is looked
// for every 5 s; a namespace not named there (one being deleted) is not.
func TestAMissingIdentityNamespaceIsLoggedOnce(t *testing.T) {
	var lines []string
	log := funcr.New(func(_, args string) { lines = append(lines, args) }, funcr.Options{})
	ctx := ctrl.LoggerInto(context.Background(), log)
	r := &IdentityReconciler{Always: []string{"locks-only"}}
	for range 3 {
		r.reportMissing(ctx, "locks-only")
		r.reportMissing(ctx, "being-deleted")
	}
	if len(lines) != 1 || !strings.Contains(lines[0], "--identity-namespaces does not exist") {
		t.Fatalf("logged %q, want one line saying the --identity-namespaces entry does not exist", lines)
	}
}
