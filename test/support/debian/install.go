// Package debian installs the Debian packages the root-only suites run on
// (PostgreSQL for the database fence, containerd, runc and the CNI plugins
// for the real node) when they are missing.
//
// Those suites may run side by side (.ci/run starts them together), and
// apt-get refuses to run while another apt-get holds its locks rather than
// waiting, so every install here takes one machine-wide lock first.
package debian

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"

	"github.com/fencer-io/fencer/test/support/machinelock"
)

// lockFile serializes the installs of every process on the machine.
const lockFile = "/run/lock/fencer-apt-get.lock"

// policyFile forbids starting services while it exists (Debian's
// policy-rc.d): a package installed for a test must not leave a server of
// its own running on the machine (postgresql creates and starts a
// cluster, containerd a daemon); the tests run their own.
const policyFile = "/usr/sbin/policy-rc.d"

// Missing is the packages whose file, by package name, is not on the
// machine.
func Missing(files map[string]string) []string {
	var missing []string
	for pkg, file := range files {
		if _, err := os.Stat(file); err != nil {
			missing = append(missing, pkg)
		}
	}
	return missing
}

// Install apt-get installs pkgs, without recommends and without starting
// their services, under the machine-wide lock. A fresh machine may have no
// package lists yet: when the install fails, the lists are updated and the
// install tried once more.
func Install(ctx context.Context, pkgs ...string) error {
	if len(pkgs) == 0 {
		return nil
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("installing %s needs root (apt-get)", strings.Join(pkgs, " "))
	}
	unlock, err := machinelock.Take(ctx, lockFile, "the apt-get install lock")
	if err != nil {
		return err
	}
	defer unlock()
	if _, err := os.Stat(policyFile); errors.Is(err, os.ErrNotExist) {
		if err := os.WriteFile(policyFile, []byte("#!/bin/sh\nexit 101\n"), 0o755); err != nil {
			return err
		}
		defer os.Remove(policyFile)
	}
	install := append([]string{"install", "-y", "--no-install-recommends"}, pkgs...)
	if aptGet(ctx, install...) == nil {
		return nil
	}
	if err := aptGet(ctx, "update"); err != nil {
		return err
	}
	return aptGet(ctx, install...)
}

func aptGet(ctx context.Context, args ...string) error {
	cmd := exec.CommandContext(ctx, "apt-get", args...)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("apt-get %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}
