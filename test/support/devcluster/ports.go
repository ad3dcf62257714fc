package devcluster

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Ports handed to a process by number are chosen from below the kernel's
// ephemeral range. A port from 127.0.0.1:0 is in that range: once its
// listener closes, any later listen on :0 or outgoing connection may take it
// before the process it was chosen for binds it. The fault run lost a
// manager that way, its webhook port taken by an etcd proxy started after
// the port was chosen.
const (
	// portsFrom stays clear of the well-known ports of a node (kubelet and
	// kube-proxy at 10248-10259, etcd at 2379-2380, the apiserver at 6443).
	portsFrom = 20000
	// ephemeralFile holds the first and last port the kernel gives out.
	ephemeralFile = "/proc/sys/net/ipv4/ip_local_port_range"
)

// freePort returns one free loopback port; see FreePorts.
func freePort() (int, error) {
	ports, err := FreePorts(1)
	if err != nil {
		return 0, err
	}
	return ports[0], nil
}

// FreePorts returns n distinct ports free on 127.0.0.1, for processes that
// take a port by number. They lie below the kernel's ephemeral range, so no
// socket the kernel numbers can take one between now and its use, and each
// is reserved on this machine for reserveFor (see reservations), so no other
// test process choosing ports at the same time can take it either.
func FreePorts(n int) ([]int, error) {
	hi, err := ephemeralStart()
	if err != nil {
		return nil, err
	}
	if hi-portsFrom < 1000 {
		return nil, fmt.Errorf("the kernel's ephemeral ports start at %d (%s), leaving too few below it above %d; lower it with sysctl net.ipv4.ip_local_port_range", hi, ephemeralFile, portsFrom)
	}
	return reservations{dir: reservationDir(), from: portsFrom, to: hi}.choose(n)
}

// ephemeralStart is the first port of the kernel's ephemeral range.
func ephemeralStart() (int, error) {
	b, err := os.ReadFile(ephemeralFile)
	if errors.Is(err, os.ErrNotExist) {
		return 32768, nil // Linux's default, where the file is not there
	}
	if err != nil {
		return 0, err
	}
	fields := strings.Fields(string(b))
	if len(fields) != 2 {
		return 0, fmt.Errorf("%s: want two ports, got %q", ephemeralFile, b)
	}
	lo, err := strconv.Atoi(fields[0])
	if err != nil {
		return 0, fmt.Errorf("%s: %w", ephemeralFile, err)
	}
	return lo, nil
}
