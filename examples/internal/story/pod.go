package story

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client/config"
)

// On the real node (`make dev NODE=real`, then `make demo NODE=real`) every
// actor is a pod running the story's image ($STORY_IMAGE), with the name
// and labels the story's manifests give it (apply creates no simulated
// pods then): it reads its token through the API and
// its etcd credentials from the mounted Secret, its timeline comes from its
// log, and the driver freezes it by signalling its container's process,
// which it finds by the pod's cgroup (the driver runs as root on the node).
// The pods run as the default ServiceAccount, with the Role each story's
// manifests grant it.

// realNode is the node the actor pods run on (test/support/devcluster).
const realNode = "real-node"

// OnRealNode tells whether the actors run as pods on the real node.
func OnRealNode() bool { return os.Getenv("STORY_IMAGE") != "" }

var (
	podsOnce   sync.Once
	podsClient kubernetes.Interface
	podsErr    error
	podLabels  = map[string]map[string]string{}
)

func podClient() (kubernetes.Interface, error) {
	podsOnce.Do(func() {
		cfg, err := config.GetConfig()
		if err != nil {
			podsErr = err
			return
		}
		podsClient, podsErr = kubernetes.NewForConfig(cfg)
	})
	return podsClient, podsErr
}

// startPod replaces pod name with one that runs role on the real node.
func startPod(role, name string, args []string) (*Actor, error) {
	ctx := context.Background()
	cs, err := podClient()
	if err != nil {
		return nil, err
	}
	labels, err := replacePod(ctx, cs, name)
	if err != nil {
		return nil, err
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: Namespace, Labels: labels},
		Spec:       ActorPodSpec(role, args...),
	}
	pod.Spec.NodeName = realNode
	pod.Spec.RestartPolicy = corev1.RestartPolicyNever
	created, err := cs.CoreV1().Pods(Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	if err := waitRunning(ctx, cs, name); err != nil {
		return nil, err
	}
	logs, err := cs.CoreV1().Pods(Namespace).GetLogs(name, &corev1.PodLogOptions{Follow: true}).Stream(ctx)
	if err != nil {
		return nil, err
	}
	a := &Actor{Pod: name, uid: string(created.UID), done: make(chan struct{})}
	go func() {
		defer close(a.done)
		defer logs.Close()
		sc := bufio.NewScanner(logs)
		for sc.Scan() {
			a.line(sc.Text())
		}
	}()
	return a, nil
}

// ActorPodSpec runs role of the story's image ($STORY_IMAGE) in a pod, as
// an actor: with the pod's name and UID from the Downward API, the
// namespace's etcd credentials mounted at /var/run/fencer/etcd, and the
// story's shared directory from the node. A pod that runs it needs the
// label EtcdClientLabel where a NetworkPolicy guards etcd.
func ActorPodSpec(role string, args ...string) corev1.PodSpec {
	env := []corev1.EnvVar{
		{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
		{Name: "POD_UID", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.uid"}}},
		{Name: "STORY_T0", Value: strconv.FormatInt(t0.UnixNano(), 10)},
		{Name: "STORY_SHARED", Value: SharedDir()},
	}
	if v := os.Getenv("CLOCK_OFFSET"); v != "" {
		env = append(env, corev1.EnvVar{Name: "CLOCK_OFFSET", Value: v})
	}
	hostPath := corev1.HostPathDirectoryOrCreate
	return corev1.PodSpec{
		Containers: []corev1.Container{{
			Name: "story", Image: os.Getenv("STORY_IMAGE"), ImagePullPolicy: corev1.PullNever,
			Args: append([]string{role}, args...), Env: env,
			VolumeMounts: []corev1.VolumeMount{
				{Name: "etcd", MountPath: "/var/run/fencer/etcd", ReadOnly: true},
				{Name: "shared", MountPath: SharedDir()},
			},
		}},
		Volumes: []corev1.Volume{
			{Name: "etcd", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "fencer-etcd-client"}}},
			{Name: "shared", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: SharedDir(), Type: &hostPath}}},
		},
	}
}

// EtcdClientLabel is the label the chart's NetworkPolicy lets reach etcd.
const EtcdClientLabel = "fencer.io/etcd-client"

// replacePod deletes the pod of that name (an earlier actor) and returns
// the labels the story's manifests give it, which the actor pod keeps: the
// Lease and IDRanges select it by them.
func replacePod(ctx context.Context, cs kubernetes.Interface, name string) (map[string]string, error) {
	old, err := cs.CoreV1().Pods(Namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case err == nil:
		podLabels[name] = old.Labels
	case !apierrors.IsNotFound(err):
		return nil, err
	}
	labels := map[string]string{EtcdClientLabel: "true"}
	for k, v := range podLabels[name] {
		labels[k] = v
	}
	zero := int64(0)
	if err := cs.CoreV1().Pods(Namespace).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil && !apierrors.IsNotFound(err) {
		return nil, err
	}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if _, err := cs.CoreV1().Pods(Namespace).Get(ctx, name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			return labels, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("pod %s still exists 60 s after its deletion", name)
		}
	}
}

func waitRunning(ctx context.Context, cs kubernetes.Interface, name string) error {
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		p, err := cs.CoreV1().Pods(Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		switch p.Status.Phase {
		case corev1.PodRunning, corev1.PodSucceeded:
			return nil
		case corev1.PodFailed:
			return fmt.Errorf("pod %s failed: %s", name, p.Status.Message)
		}
	}
	return fmt.Errorf("pod %s not Running after 60 s: is the image %s imported on %s (make demo NODE=real)?", name, os.Getenv("STORY_IMAGE"), realNode)
}

// signalPod signals the story's process in the actor's container.
func (a *Actor) signalPod(sig syscall.Signal) error {
	pids, err := a.podPIDs()
	if err != nil {
		return err
	}
	for _, pid := range pids {
		if err := syscall.Kill(pid, sig); err != nil {
			return fmt.Errorf("signalling %s's process %d: %w (the demo needs root on the real node)", a.Pod, pid, err)
		}
	}
	return nil
}

// podPIDs are the story processes on this machine in the actor pod's
// cgroup.
func (a *Actor) podPIDs() ([]int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	underscored := strings.ReplaceAll(a.uid, "-", "_")
	var pids []int
	for _, e := range entries {
		comm, err := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
		if err != nil || strings.TrimSpace(string(comm)) != "story" {
			continue
		}
		cg, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup"))
		if !strings.Contains(string(cg), a.uid) && !strings.Contains(string(cg), underscored) {
			continue
		}
		pid, _ := strconv.Atoi(e.Name())
		pids = append(pids, pid)
	}
	if len(pids) == 0 {
		return nil, errors.New("no process of pod " + a.Pod + " found on this machine")
	}
	return pids, nil
}

// podLog is the actor pod's whole log as the kubelet has it now, read
// afresh rather than from the followed stream.
func (a *Actor) podLog(ctx context.Context) (string, error) {
	cs, err := podClient()
	if err != nil {
		return "", err
	}
	raw, err := cs.CoreV1().Pods(Namespace).GetLogs(a.Pod, &corev1.PodLogOptions{}).DoRaw(ctx)
	return string(raw), err
}

// processStates is the State line of each of the pod's processes, such as
// "S (sleeping)" or "T (stopped)".
func (a *Actor) processStates() string {
	pids, err := a.podPIDs()
	if err != nil {
		return err.Error()
	}
	var states []string
	for _, pid := range pids {
		status, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
		for _, l := range strings.Split(string(status), "\n") {
			if strings.HasPrefix(l, "State:") {
				states = append(states, fmt.Sprintf("%d %s", pid, strings.TrimSpace(strings.TrimPrefix(l, "State:"))))
			}
		}
	}
	return strings.Join(states, ", ")
}

// deletePod ends an actor pod and waits for its log to end.
func (a *Actor) deletePod() {
	ctx := context.Background()
	if cs, err := podClient(); err == nil {
		zero := int64(0)
		_ = cs.CoreV1().Pods(Namespace).Delete(ctx, a.Pod, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	}
	select {
	case <-a.done:
	case <-time.After(30 * time.Second):
	}
}

// SharedDir is a directory the driver and its actors all see: the actor
// pods mount it from the node at the same path.
func SharedDir() string {
	if d := os.Getenv("STORY_SHARED"); d != "" {
		return d
	}
	return filepath.Join(os.TempDir(), "fencer-story")
}
