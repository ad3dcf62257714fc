package devcluster

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// proc is one child process of the dev cluster, logging to <dir>/logs/<name>.log.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error // the Wait result, valid once done is closed
}

func startProc(dir, name, bin string, args ...string) (*proc, error) {
	logPath := filepath.Join(dir, "logs", name+".log")
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		return nil, err
	}
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Dir = dir
	// Its own process group, so that stopping it stops anything it forked; and
	// killed with us, so a dev run that is itself SIGKILLed leaves nothing behind.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("starting %s (%s): %w", name, bin, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	return p, nil
}

// exited reports an error if the process has already ended.
func (p *proc) exited() error {
	select {
	case <-p.done:
		return fmt.Errorf("%s exited early (%w); see %s, which ends:\n%s", p.name, p.err, p.log, logTail(p.log, 5))
	default:
		return nil
	}
}

// stop sends SIGTERM to the process group, then SIGKILL after grace.
func (p *proc) stop(grace time.Duration) error {
	pgid := p.cmd.Process.Pid
	select {
	case <-p.done:
		_ = syscall.Kill(-pgid, syscall.SIGKILL) // reap any stragglers of the group
		return nil
	default:
	}
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-p.done
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	var exitErr *exec.ExitError
	if p.err != nil && !errors.As(p.err, &exitErr) {
		return fmt.Errorf("%s: %w", p.name, p.err)
	}
	return nil
}

// kill sends SIGKILL to the process group and waits for the process.
func (p *proc) kill() {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// logTail is the last n lines of a log, for the error that reports a process
// gone: CI keeps the test's output, not the files it wrote.
func logTail(path string, n int) string {
	raw, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(unreadable: %v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(raw), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "\t" + strings.Join(lines, "\n\t")
}
