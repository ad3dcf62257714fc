// Package story is the shared kit of the runnable examples: a timeline every
// process prints to in one format, the connections a program needs (the
// Kubernetes API and the namespace's etcd identity), and the driver's
// handles on the processes it plays the story with (start, pause with
// SIGSTOP, resume, kill).
//
// Each example is one binary with two roles: `demo` is the driver, which
// `make demo STORY=<name>` runs against `make dev`; every other role is an
// actor the driver starts as a process of its own, standing in for one pod
// (POD_NAME) and reading that pod's annotations through the API
// (fence.PodSource), as it would in a container.
package story

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/config"

	fencerv1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/pkg/fence"
)

// Namespace is where the stories run.
const Namespace = "default"

// t0 is the timeline's origin, shared by the driver and its actors through
// STORY_T0, so every line of every process is on one clock.
var t0 = func() time.Time {
	if ns, err := strconv.ParseInt(os.Getenv("STORY_T0"), 10, 64); err == nil {
		return time.Unix(0, ns)
	}
	return time.Now()
}()

var sayMu sync.Mutex

// Say prints one line of the timeline: seconds since the story began, who,
// and what happened.
func Say(who, format string, args ...any) {
	sayMu.Lock()
	defer sayMu.Unlock()
	fmt.Printf("%7.2fs  %-12s %s\n", time.Since(t0).Seconds(), who, fmt.Sprintf(format, args...))
}

// Kube connects to the cluster from $KUBECONFIG, or in-cluster in a pod.
func Kube() (client.Client, error) {
	cfg, err := config.GetConfig()
	if err != nil {
		return nil, err
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := fencerv1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	return client.New(cfg, client.Options{Scheme: scheme})
}

// Env is what an actor talks to: the Kubernetes API, and fencer's etcd as
// the namespace's identity.
type Env struct {
	K8s    client.Client
	Etcd   *clientv3.Client
	Prefix string
}

// Connect connects to both.
func Connect(ctx context.Context) (*Env, error) {
	k, err := Kube()
	if err != nil {
		return nil, err
	}
	etcd, prefix, err := Etcd(ctx, k)
	if err != nil {
		return nil, err
	}
	return &Env{K8s: k, Etcd: etcd, Prefix: prefix}, nil
}

// Etcd connects as the namespace's etcd identity: from the mounted Secret
// in a pod, and otherwise from the Secret itself, read through the API,
// as a local process standing in for a pod does.
func Etcd(ctx context.Context, k client.Client) (*clientv3.Client, string, error) {
	dir := fence.DefaultCredentialsDir
	if _, err := os.Stat(dir); err != nil {
		var err error
		if dir, err = secretToDir(ctx, k); err != nil {
			return nil, "", err
		}
	}
	access, err := fence.LoadEtcdAccess(dir)
	if err != nil {
		return nil, "", err
	}
	access.Config.Logger = zap.NewNop()
	cli, err := clientv3.New(access.Config)
	return cli, access.Prefix, err
}

// secretToDir writes the namespace's credentials Secret where
// fence.LoadEtcdAccess reads them, as the kubelet would mount it. Every
// local actor shares one directory (the SDK re-reads the files on each
// connection, so they stay), and each file is replaced whole.
func secretToDir(ctx context.Context, k client.Client) (string, error) {
	var s corev1.Secret
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		err := k.Get(ctx, client.ObjectKey{Namespace: Namespace, Name: "fencer-etcd-client"}, &s)
		if err == nil {
			break
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return "", fmt.Errorf("no Secret fencer-etcd-client in namespace %s after 60 s (fencer issues it once the namespace has a Lease or IDRange): %w", Namespace, err)
		}
	}
	dir := filepath.Join(os.TempDir(), "fencer-story-etcd-"+Namespace)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	for name, data := range s.Data {
		tmp, err := os.CreateTemp(dir, "."+name)
		if err != nil {
			return "", err
		}
		_, werr := tmp.Write(data)
		if err := errors.Join(werr, tmp.Close()); err != nil {
			return "", err
		}
		if err := os.Rename(tmp.Name(), filepath.Join(dir, name)); err != nil {
			return "", err
		}
	}
	return dir, nil
}

// Pod is the pod this actor stands in for.
func Pod() string { return os.Getenv("POD_NAME") }

// PodUID is that pod's UID, from the Downward API (POD_UID; the driver
// sets it for a process standing in for a simulated pod). It is never
// looked up by the pod's name: after a pod is replaced under its name
// (a StatefulSet's), that lookup would give the old pod's process its
// successor's UID, and so its successor's token.
func PodUID() (types.UID, error) {
	uid := os.Getenv("POD_UID")
	if uid == "" {
		return "", errors.New("POD_UID is not set: give the container the env POD_UID from the Downward API (fieldRef metadata.uid), so it reads only its own pod's token")
	}
	return types.UID(uid), nil
}

// WaitToken waits until this pod (by its UID) holds lease, reading its
// token through the API, until ctx ends.
func WaitToken(ctx context.Context, k client.Client, lease string) (fence.Token, error) {
	uid, err := PodUID()
	if err != nil {
		return fence.Token{}, err
	}
	src := fence.PodSource{Client: k, Namespace: Namespace, Pod: Pod(), UID: uid, Lease: lease}
	for {
		if t, err := src.Token(ctx); err == nil && t.Value > 0 {
			return t, nil
		}
		select {
		case <-ctx.Done():
			return fence.Token{}, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Acquire waits until this pod holds the renewal: Direct lease and its
// process keeps the grant alive (fence.Hold). The returned context ends
// when the lease is lost. A token the pod's annotation still shows from a
// grant that already expired is skipped.
func Acquire(ctx context.Context, env *Env, lease string) (fence.Token, context.Context, error) {
	var stale int64
	for {
		t, err := WaitToken(ctx, env.K8s, lease)
		if err != nil {
			return fence.Token{}, nil, err
		}
		if t.Value == stale {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		held, err := fence.Hold(ctx, env.Etcd, env.Prefix, Namespace, t)
		if err == nil {
			return t, held, nil
		}
		stale = t.Value
	}
}
