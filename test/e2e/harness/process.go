package harness

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/fencer-io/fencer/test/support/faultproxy"
)

// process is a manager or worker the nemesis can pause, kill and restart.
// Its etcd traffic goes through proxies, one per etcd member, so it can be
// partitioned.
type process struct {
	name    string
	bin     string
	args    []string
	log     string
	proxies []*faultproxy.Proxy

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{}
	paused  bool
	starts  int
	stopped bool // stopped on purpose: not to be restarted
}

func (p *process) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := os.MkdirAll(filepath.Dir(p.log), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(f, "=== start %d at %s\n", p.starts, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(p.bin, p.args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("starting %s: %w", p.name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); f.Close(); close(done) }()
	p.cmd, p.done, p.paused, p.stopped = cmd, done, false, false
	p.starts++
	return nil
}

// running reports whether the process is alive (paused counts).
func (p *process) running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

func (p *process) signal(sig syscall.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, sig)
	switch sig {
	case syscall.SIGSTOP:
		p.paused = true
	case syscall.SIGCONT:
		p.paused = false
	}
}

func (p *process) pause()  { p.signal(syscall.SIGSTOP) }
func (p *process) resume() { p.signal(syscall.SIGCONT) }

// kill ends the process with SIGKILL, as a crash.
func (p *process) kill() { p.end(syscall.SIGKILL, 0) }

// stop ends the process with SIGTERM, SIGKILL after grace, and marks it
// stopped on purpose.
func (p *process) stop(grace time.Duration) {
	p.mu.Lock()
	p.stopped = true
	p.mu.Unlock()
	p.end(syscall.SIGTERM, grace)
}

func (p *process) end(sig syscall.Signal, grace time.Duration) {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	pg := -cmd.Process.Pid
	_ = syscall.Kill(pg, syscall.SIGCONT) // a stopped process cannot act on SIGTERM
	_ = syscall.Kill(pg, sig)
	select {
	case <-done:
	case <-time.After(grace):
		_ = syscall.Kill(pg, syscall.SIGKILL)
		<-done
	}
}

func (p *process) partition(m faultproxy.Mode) {
	for _, px := range p.proxies {
		px.Set(m)
	}
}
