package story

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// A node partition on the real node, as the statefulset-zombie story plays
// it: the node's kubelet frozen, so that nothing reports on its pods or
// stops their containers, while the containers run on.

// Attach follows a pod on the real node that the story did not create (a
// StatefulSet's, say) as an actor: its timeline comes from its container's
// log file on this machine, which containerd writes even while the kubelet
// is frozen, and it is paused and resumed through its cgroup. Kill stops
// only the following: the pod is its controller's.
func Attach(ctx context.Context, pod *corev1.Pod) (*Actor, error) {
	a := &Actor{Pod: pod.Name, uid: string(pod.UID), attached: true, done: make(chan struct{}), stop: make(chan struct{})}
	path, err := containerLog(ctx, pod)
	if err != nil {
		return nil, err
	}
	go a.follow(path)
	return a, nil
}

// containerLog finds the log file of pod's story container: the kubelet
// links it from /var/log/containers, and its target names the pod's UID.
func containerLog(ctx context.Context, pod *corev1.Pod) (string, error) {
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		links, _ := filepath.Glob(fmt.Sprintf("/var/log/containers/%s_%s_story-*.log", pod.Name, pod.Namespace))
		for _, l := range links {
			if target, err := os.Readlink(l); err == nil && strings.Contains(target, string(pod.UID)) {
				return target, nil
			}
		}
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
	}
	return "", fmt.Errorf("no log of pod %s (uid %s) in /var/log/containers after 60 s: the demo reads it on the real node, as root", pod.Name, pod.UID)
}

// follow reads the container's log file as it grows, one CRI log line
// (`<time> <stream> <tag> <text>`) at a time, until Kill.
func (a *Actor) follow(path string) {
	defer close(a.done)
	f, err := os.Open(path)
	if err != nil {
		Say("demo", "could not read %s's log: %v", a.Pod, err)
		return
	}
	defer f.Close()
	r := bufio.NewReader(f)
	var partial string
	for {
		chunk, err := r.ReadString('\n')
		partial += chunk
		if err == nil {
			if fields := strings.SplitN(strings.TrimSuffix(partial, "\n"), " ", 4); len(fields) == 4 && fields[1] == "stdout" {
				a.line(fields[3])
			}
			partial = ""
			continue
		}
		if !errors.Is(err, io.EOF) {
			return
		}
		select {
		case <-a.stop:
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// FreezeKubelet stops the real node's kubelet with SIGSTOP, as a partition
// cuts a node off: its containers run on, and nothing reports on them or
// stops them. Call resume to let it go on; it then stops the containers
// of pods no longer bound to it.
func FreezeKubelet() (resume func(), err error) {
	pid, err := realKubelet()
	if err != nil {
		return nil, err
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return nil, fmt.Errorf("freezing the kubelet (pid %d): %w (the demo needs root on the real node)", pid, err)
	}
	Say("demo", "SIGSTOP the kubelet of %s: the node stops answering, its containers run on", realNode)
	return func() {
		if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
			Say("demo", "could not resume the kubelet (pid %d): %v", pid, err)
			return
		}
		Say("demo", "SIGCONT the kubelet of %s: it stops the containers of pods it no longer runs", realNode)
	}, nil
}

// realKubelet is the process ID of the real node's kubelet.
func realKubelet() (int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range entries {
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(cmdline), "\x00")
		if filepath.Base(args[0]) == "kubelet" && strings.Contains(string(cmdline), "--hostname-override="+realNode) {
			return strconv.Atoi(e.Name())
		}
	}
	return 0, fmt.Errorf("no kubelet of %s runs on this machine: is `make dev NODE=real` running here?", realNode)
}

// Cordon marks node unschedulable, or schedulable again.
func Cordon(ctx context.Context, k client.Client, node string, cordon bool) error {
	n := &corev1.Node{}
	if err := k.Get(ctx, client.ObjectKey{Name: node}, n); err != nil {
		return err
	}
	patch := client.MergeFrom(n.DeepCopy())
	n.Spec.Unschedulable = cordon
	return k.Patch(ctx, n, patch)
}

// SimulatedNodes are the dev cluster's kwok nodes.
func SimulatedNodes(ctx context.Context, k client.Client) ([]string, error) {
	var nodes corev1.NodeList
	if err := k.List(ctx, &nodes, client.MatchingLabels{"type": "kwok"}); err != nil {
		return nil, err
	}
	var names []string
	for _, n := range nodes.Items {
		names = append(names, n.Name)
	}
	return names, nil
}

// RealNode is the name of the real node, where OnRealNode's pods run.
const RealNode = realNode
