//go:build !fencer_e2e_broken

package webhook

// brokenForTests is false in every real build. The fault harness builds a
// manager with the fencer_e2e_broken tag, where it is true and the webhook
// admits every fenced write, to prove its checker catches stale writes.
const brokenForTests = false
