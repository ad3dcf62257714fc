//go:build tools

// Package tools pins promtool's module.
package tools

import _ "github.com/prometheus/prometheus/cmd/promtool"
