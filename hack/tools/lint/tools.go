//go:build tools

// Package tools pins golangci-lint, built by hack/build-tools.sh.
package tools

import _ "github.com/golangci/golangci-lint/v2/cmd/golangci-lint"
