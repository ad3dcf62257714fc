// Package manifest reads Kubernetes manifest files: YAML or JSON, one
// object or several separated by "---".
package manifest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// Read returns the objects of a manifest file, leaving out empty documents.
func Read(path string) ([]*unstructured.Unstructured, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096)
	var out []*unstructured.Unstructured
	for {
		obj := &unstructured.Unstructured{}
		if err := dec.Decode(&obj.Object); errors.Is(err, io.EOF) {
			return out, nil
		} else if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if len(obj.Object) > 0 {
			out = append(out, obj)
		}
	}
}

// PoliciesFile is the chart's admission policies as `make manifests`
// renders them, relative to the repository root: the status guard, a
// ValidatingAdmissionPolicy that admits status writes only from the
// manager named by its variable "manager", and the ignored-label warning,
// which spares that manager's writes; each with its binding.
const PoliciesFile = "config/guard/policies.yaml"

// Policies reads the admission policies from path and names manager (a
// username) in each policy's variable "manager": make dev and the tests
// run the manager under their own identity, not the chart's service
// account.
func Policies(path, manager string) ([]*unstructured.Unstructured, error) {
	objs, err := Read(path)
	if err != nil {
		return nil, err
	}
	set := false
	for _, obj := range objs {
		if obj.GetKind() != "ValidatingAdmissionPolicy" {
			continue
		}
		vars, _, _ := unstructured.NestedSlice(obj.Object, "spec", "variables")
		for _, v := range vars {
			if m, ok := v.(map[string]any); ok && m["name"] == "manager" {
				m["expression"] = strconv.Quote(manager)
				set = true
			}
		}
		if err := unstructured.SetNestedSlice(obj.Object, vars, "spec", "variables"); err != nil {
			return nil, err
		}
	}
	if !set {
		return nil, fmt.Errorf("%s: no ValidatingAdmissionPolicy with a variable named manager", path)
	}
	return objs, nil
}
