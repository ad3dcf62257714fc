//go:build fencer_e2e_broken

package webhook

// brokenForTests: this build admits every fenced write (see broken.go).
// Only the fault harness's checker test builds it.
const brokenForTests = true
