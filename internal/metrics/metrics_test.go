package metrics

import (
	"go/ast"
	"go/parser"
	"go/token"
	"strconv"
	"strings"
	"testing"
)

// Every reason the webhook can refuse with is named in the decisions
// metric's Help, which is where its label values are documented: the
// reasons are read from the API package's source, so a new one fails
// here until the Help (and docs/webhook.md) name it.
func TestAdmissionDecisionsHelpNamesEveryDenialReason(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "../../api/v1alpha1/wellknown.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var reasons []string
	ast.Inspect(f, func(n ast.Node) bool {
		if v, ok := n.(*ast.ValueSpec); ok {
			if id, ok := v.Type.(*ast.Ident); ok && id.Name == "DenialReason" {
				for _, val := range v.Values {
					if lit, ok := val.(*ast.BasicLit); ok {
						s, _ := strconv.Unquote(lit.Value)
						reasons = append(reasons, s)
					}
				}
			}
		}
		return true
	})
	if len(reasons) < 10 {
		t.Fatalf("found only %d DenialReason constants: %v", len(reasons), reasons)
	}
	help := admissionDecisionsHelp
	for _, r := range reasons {
		if !strings.Contains(help, " "+r+",") && !strings.Contains(help, " "+r+" ") {
			t.Errorf("reason %s is not named in fencer_admission_decisions_total's Help", r)
		}
	}
}
