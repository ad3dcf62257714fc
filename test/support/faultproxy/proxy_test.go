package faultproxy

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// echo serves a line-echo server and returns its address.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	return ln.Addr().String()
}

// roundTrip writes a line and reads it back within timeout.
func roundTrip(c net.Conn, timeout time.Duration) error {
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if line != "ping\n" {
		return errors.New("echo garbled: " + line)
	}
	return nil
}

func start(t *testing.T, backends ...string) *Proxy {
	t.Helper()
	p, err := Start(backends...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func TestPassBlackholeHeal(t *testing.T) {
	p := start(t, echo(t))
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := roundTrip(c, 2*time.Second); err != nil {
		t.Fatalf("pass: %v", err)
	}

	p.Set(Blackhole)
	// A blackhole times out; it does not fail fast.
	if err := roundTrip(c, 300*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("blackholed connection: got %v, want a timeout", err)
	}
	fresh, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatalf("a blackhole still accepts connections: %v", err)
	}
	defer fresh.Close()
	if err := roundTrip(fresh, 300*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("connection opened during the blackhole: got %v, want a timeout", err)
	}

	p.Set(Pass)
	// Healing closes blackholed streams (they lost data); new ones work.
	if err := roundTrip(c, time.Second); err == nil {
		t.Fatal("a blackholed connection survived healing")
	}
	healed, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer healed.Close()
	if err := roundTrip(healed, 2*time.Second); err != nil {
		t.Fatalf("after healing: %v", err)
	}
}

func TestResetFailsFast(t *testing.T) {
	p := start(t, echo(t))
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p.Set(Reset)
	if err := roundTrip(c, 2*time.Second); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("open connection under Reset: got %v, want a closed connection", err)
	}
	nc, err := net.Dial("tcp", p.Addr())
	if err == nil {
		defer nc.Close()
		if err := roundTrip(nc, 2*time.Second); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("new connection under Reset: got %v, want it closed at once", err)
		}
	}
}

func TestDelay(t *testing.T) {
	p := start(t, echo(t))
	p.SetDelay(150 * time.Millisecond)
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Both directions are delayed, so a round trip inside 150 ms is a bug.
	if err := roundTrip(c, 150*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("delayed round trip: got %v, want a timeout at 150ms", err)
	}
}

func TestFailsOverToALiveBackend(t *testing.T) {
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.Addr().String()
	dead.Close()
	p := start(t, deadAddr, echo(t))
	for range 4 { // both round-robin starting points
		c, err := net.Dial("tcp", p.Addr())
		if err != nil {
			t.Fatal(err)
		}
		if err := roundTrip(c, 2*time.Second); err != nil {
			t.Fatalf("with one backend down: %v", err)
		}
		c.Close()
	}
}
