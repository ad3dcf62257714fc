package story

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Actor is a process the driver started, standing in for one pod.
type Actor struct {
	Pod string
	cmd *exec.Cmd // a local process, or
	uid string    // a pod on the real node
	// attached: a pod the story did not create (Attach); stop ends its
	// following.
	attached bool
	stop     chan struct{}
	mu       sync.Mutex
	seen     []string
	done     chan struct{}
}

// Start runs this binary again in role for pod: as a local process, or on
// the real node as the pod itself (OnRealNode). Its timeline lines go to
// stdout as they come, and WaitForCount can wait for them.
func Start(role, pod string, args ...string) (*Actor, error) {
	if OnRealNode() {
		return startPod(role, pod, args)
	}
	return StartLocal(role, pod, args...)
}

// StartLocal runs this binary again in role as a local process standing
// in for pod, even on the real node: for a pod on a kwok node, which runs
// no process of its own.
// It is given the pod's name and UID, as the Downward API gives a
// container: the pod as it is now, so start it only once its pod exists.
func StartLocal(role, pod string, args ...string) (*Actor, error) {
	uid, err := podUID(pod)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(os.Args[0], append([]string{role}, args...)...)
	cmd.Env = append(os.Environ(), "POD_NAME="+pod, "POD_UID="+string(uid), "STORY_T0="+strconv.FormatInt(t0.UnixNano(), 10))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	a := &Actor{Pod: pod, cmd: cmd, done: make(chan struct{})}
	go func() {
		defer close(a.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			a.line(sc.Text())
		}
		_ = cmd.Wait()
	}()
	return a, nil
}

// podUID reads the UID of the pod named pod in the story's namespace.
func podUID(pod string) (types.UID, error) {
	k, err := Kube()
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p := &corev1.Pod{}
	if err := k.Get(ctx, client.ObjectKey{Namespace: Namespace, Name: pod}, p); err != nil {
		return "", fmt.Errorf("reading pod %s, whose UID its stand-in process gets as POD_UID: %w", pod, err)
	}
	return p.UID, nil
}

// line prints one timeline line of the actor and remembers it.
func (a *Actor) line(l string) {
	fmt.Println(l)
	a.mu.Lock()
	a.seen = append(a.seen, l)
	a.mu.Unlock()
}

// Count is how many lines the actor printed that contain s.
func (a *Actor) Count(s string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, l := range a.seen {
		if strings.Contains(l, s) {
			n++
		}
	}
	return n
}

// Printed reports whether the actor printed a line containing s.
func (a *Actor) Printed(s string) bool { return a.Count(s) > 0 }

// WaitForCount waits until the actor printed n lines containing s.
func (a *Actor) WaitForCount(ctx context.Context, s string, n int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for a.Count(s) < n {
		if time.Now().After(deadline) {
			return a.notPrinted(ctx, s, n, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-a.done:
			if a.Count(s) >= n {
				return nil
			}
			return fmt.Errorf("%s exited before printing %q %d times", a.Pod, s, n)
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

// notPrinted explains a WaitForCount that timed out. For an actor pod it
// reads the pod's log afresh: when the kubelet's followed log stream lags
// behind, the line is there and the wait succeeds, saying so. Otherwise the
// error carries the state of the pod's processes (a silent process or a
// stopped one) and its whole log, with its goroutines' stacks: a resumed
// process that stays silent is stuck somewhere. (The one such hang seen,
// pods whose packets to the node were dropped for seconds, was the real
// node's bridge changing its MAC as pods came and went; see
// test/support/devcluster.)
func (a *Actor) notPrinted(ctx context.Context, s string, n int, timeout time.Duration) error {
	err := fmt.Errorf("%s did not print %q %d times within %s", a.Pod, s, n, timeout)
	if a.cmd != nil || a.attached {
		return err
	}
	log, logErr := a.podLog(ctx)
	if logErr != nil {
		return fmt.Errorf("%w; reading its log: %w", err, logErr)
	}
	var fresh []string
	for _, l := range strings.Split(strings.TrimSpace(log), "\n") {
		if strings.Contains(l, s) {
			fresh = append(fresh, l)
		}
	}
	if len(fresh) >= n {
		Say("demo", "(%s's followed log stream lagged; its log has %q)", a.Pod, s)
		for _, l := range fresh[a.Count(s):] {
			a.line(l)
		}
		return nil
	}
	states := a.processStates()
	// A Go process dumps every goroutine's stack on SIGQUIT: where it is
	// stuck, in its log.
	if a.signalPod(syscall.SIGQUIT) == nil {
		time.Sleep(2 * time.Second)
		if after, err := a.podLog(ctx); err == nil {
			log = after
		}
	}
	return fmt.Errorf("%w; its processes: %s; its whole log (with its goroutines, after SIGQUIT):\n%s", err, states, log)
}

// Max is the largest number that follows prefix in the actor's lines.
func (a *Actor) Max(prefix string) int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	var most int64
	for _, l := range a.seen {
		if _, after, ok := strings.Cut(l, prefix); ok {
			digits := strings.FieldsFunc(after, func(r rune) bool { return r < '0' || r > '9' })
			if len(digits) > 0 {
				if n, err := strconv.ParseInt(digits[0], 10, 64); err == nil && n > most {
					most = n
				}
			}
		}
	}
	return most
}

// Pause stops the process (SIGSTOP), as a GC pause or a frozen VM would.
func (a *Actor) Pause() {
	a.signal(syscall.SIGSTOP)
	Say("demo", "SIGSTOP %s: the process is frozen", a.Pod)
}

// Resume continues a paused process (SIGCONT).
func (a *Actor) Resume() {
	a.signal(syscall.SIGCONT)
	Say("demo", "SIGCONT %s: it wakes up and carries on where it stopped", a.Pod)
}

// Kill ends the process and waits for it.
func (a *Actor) Kill() {
	if a.attached {
		close(a.stop)
		<-a.done
		return
	}
	if a.cmd == nil {
		a.deletePod()
		return
	}
	_ = a.cmd.Process.Signal(syscall.SIGCONT)
	_ = a.cmd.Process.Kill()
	<-a.done
}

func (a *Actor) signal(sig syscall.Signal) {
	var err error
	if a.cmd != nil {
		err = a.cmd.Process.Signal(sig)
	} else {
		err = a.signalPod(sig)
	}
	if err != nil {
		Say("demo", "could not signal %s (%s): %v", a.Pod, sig, err)
	}
}

// KillAll kills every actor.
func KillAll(actors ...*Actor) {
	for _, a := range actors {
		if a != nil {
			a.Kill()
		}
	}
}

// Verdict is how a run of the story ended: Anomaly says what went wrong,
// empty when nothing did. The driver prints one RESULT line per run, which
// the e2e test reads.
func Verdict(mode, anomaly string) {
	if anomaly == "" {
		Say("demo", "RESULT %s: no anomaly", mode)
		return
	}
	Say("demo", "RESULT %s: ANOMALY: %s", mode, anomaly)
}

// Section prints a heading between the runs of a story.
func Section(title string) {
	fmt.Printf("\n=== %s\n\n", title)
}

// FirstTo waits until one of two actors prints a line containing s, and
// returns it, then the other.
func FirstTo(ctx context.Context, s string, a, b *Actor) (*Actor, *Actor, error) {
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		switch {
		case a.Printed(s):
			return a, b, nil
		case b.Printed(s):
			return b, a, nil
		}
		select {
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil, nil, fmt.Errorf("neither %s nor %s printed %q within 60 s: is the Lease granted (kubectl get flease)?", a.Pod, b.Pod, s)
}
