// Package faultproxy is a TCP proxy that can delay, blackhole or reset the
// link it carries: a network partition without root or iptables. The fault
// harness puts one between every fencer process and every etcd member, and
// one in front of the webhook.
package faultproxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Mode is what the proxy does with traffic.
type Mode int32

const (
	// Pass forwards everything.
	Pass Mode = iota
	// Blackhole accepts connections and reads from both sides but forwards
	// nothing, as a partition that drops packets: clients see timeouts, not
	// errors. Connections blackholed are closed when the link heals, as their
	// streams have lost data.
	Blackhole
	// Reset closes every connection and refuses new ones at once, as a
	// peer that is down.
	Reset
)

func (m Mode) String() string {
	switch m {
	case Pass:
		return "pass"
	case Blackhole:
		return "blackhole"
	case Reset:
		return "reset"
	}
	return fmt.Sprintf("Mode(%d)", int32(m))
}

// Proxy forwards connections from its listener to the first of its backends
// that accepts, trying them round robin (a Service in front of replicas).
type Proxy struct {
	ln       net.Listener
	backends []string
	next     atomic.Uint32
	delay    atomic.Int64 // nanoseconds added before each forwarded chunk

	mu    sync.Mutex
	mode  Mode
	conns map[*link]struct{}
	wg    sync.WaitGroup
}

// link is one client connection and its backend connection.
type link struct {
	client, backend net.Conn
	dropping        atomic.Bool
}

func (l *link) close() {
	l.client.Close()
	if l.backend != nil {
		l.backend.Close()
	}
}

// Start listens on 127.0.0.1 (a free port) and forwards to backends.
func Start(backends ...string) (*Proxy, error) {
	if len(backends) == 0 {
		return nil, errors.New("faultproxy: no backend")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, backends: backends, conns: map[*link]struct{}{}}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

// Addr is host:port of the listener.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Mode reports the current mode.
func (p *Proxy) Mode() Mode {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mode
}

// Set switches the mode. Blackhole and Reset apply to open connections too;
// going back to Pass closes the connections that were blackholed.
func (p *Proxy) Set(m Mode) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mode = m
	for l := range p.conns {
		switch {
		case m == Reset || (m == Pass && l.dropping.Load()):
			l.close()
			delete(p.conns, l)
		case m == Blackhole:
			l.dropping.Store(true)
		}
	}
}

// SetDelay adds d before every chunk forwarded in either direction.
func (p *Proxy) SetDelay(d time.Duration) { p.delay.Store(int64(d)) }

// Close stops the listener and every connection.
func (p *Proxy) Close() error {
	err := p.ln.Close()
	p.Set(Reset)
	p.wg.Wait()
	return err
}

func (p *Proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go p.handle(c)
	}
}

func (p *Proxy) handle(c net.Conn) {
	defer p.wg.Done()
	l := &link{client: c}
	switch p.Mode() {
	case Reset:
		c.Close()
		return
	case Blackhole:
		l.dropping.Store(true)
	default:
		if l.backend = p.dial(); l.backend == nil {
			c.Close()
			return
		}
	}
	if !p.track(l) {
		return
	}
	defer p.untrack(l)
	if l.backend == nil {
		_, _ = io.Copy(io.Discard, c) // blackholed from the start; never forwards
		return
	}
	done := make(chan struct{}, 2)
	go func() { p.pipe(l, l.backend, l.client); done <- struct{}{} }()
	go func() { p.pipe(l, l.client, l.backend); done <- struct{}{} }()
	<-done
	l.close()
	<-done
}

// track registers l unless the mode changed to Reset meanwhile.
func (p *Proxy) track(l *link) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mode == Reset {
		l.close()
		return false
	}
	if p.mode == Blackhole {
		l.dropping.Store(true)
	}
	p.conns[l] = struct{}{}
	return true
}

func (p *Proxy) untrack(l *link) {
	p.mu.Lock()
	delete(p.conns, l)
	p.mu.Unlock()
	l.close()
}

func (p *Proxy) dial() net.Conn {
	start := p.next.Add(1)
	for i := range len(p.backends) {
		addr := p.backends[(int(start)+i)%len(p.backends)]
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			return c
		}
	}
	return nil
}

// pipe copies src to dst, dropping what it reads once the link is
// blackholed.
func (p *Proxy) pipe(l *link, dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !l.dropping.Load() {
			if d := time.Duration(p.delay.Load()); d > 0 {
				time.Sleep(d)
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
