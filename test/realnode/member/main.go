// Command member is the real node's partition test workload: one member of
// a StatefulSet or an Indexed Job, fenced by the Lease its WorkloadLease
// made for it. Every 200 ms it reads its token from its Downward API file,
// as a workload would, and writes under it: the fenced ConfigMap, the
// fenced etcd key and the guarded database row (package fencedwrites).
//
// It is a careless zombie on purpose: it never stops writing, even once it
// knows its tenure ended, so that only fencer can keep its writes out. It
// reaches the Kubernetes API with a token that is not bound to its pod
// (mounted from a Secret, /etc/member/token): the apiserver stops
// accepting a pod-bound token soon after the pod object is gone, and the
// test is about fencer's refusals, not the apiserver's. It reaches etcd as
// its namespace's identity and PostgreSQL over a unix socket.
//
// It prints one JSON line per round, which the test reads from the
// container's log file on the node.
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencer-io/fencer/pkg/dbfence"
	"github.com/fencer-io/fencer/pkg/fence"
	"github.com/fencer-io/fencer/test/realnode/fencedwrites"
)

// round is one line of the log.
type round struct {
	At        time.Time              `json:"at"`
	Pod       string                 `json:"pod"`
	UID       string                 `json:"uid"`
	Lease     string                 `json:"lease"`
	FileToken int64                  `json:"fileToken"`
	APIToken  int64                  `json:"apiToken"`
	Token     int64                  `json:"token"`
	APIErr    string                 `json:"apiErr,omitempty"`
	Hold      string                 `json:"hold,omitempty"`
	Attempts  []fencedwrites.Attempt `json:"attempts,omitempty"`
	Err       string                 `json:"err,omitempty"`
}

func main() {
	ctx := context.Background()
	t, err := connect(ctx, os.Getenv("POD_NAMESPACE"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "member:", err)
		os.Exit(1)
	}
	writeOn(ctx, t)
}

// writeOn writes every 200 ms, for ever.
func writeOn(ctx context.Context, t fencedwrites.Targets) {
	pod, ns, uid := os.Getenv("POD_NAME"), t.Namespace, types.UID(os.Getenv("POD_UID"))
	// A StatefulSet pod's Lease is its own name; an Indexed Job's is
	// <job>-<completion index>.
	lease := pod
	if job := os.Getenv("JOB_NAME"); job != "" {
		lease = job + "-" + os.Getenv("JOB_INDEX")
	}
	file := fence.FileSource{Path: "/etc/podinfo/annotations", Lease: lease}
	api := fence.PodSource{Client: t.Kube, Namespace: ns, Pod: pod, UID: uid, Lease: lease}
	var held context.Context // the Direct grant's Hold, once taken
	var heldToken int64
	for {
		r := round{At: time.Now(), Pod: pod, UID: string(uid), Lease: lease}
		tok, err := file.Token(ctx)
		r.FileToken = tok.Value
		if err != nil && !errors.Is(err, fence.ErrNotHolder) {
			r.Err = err.Error()
		}
		// The API is current where the Downward API file lags (a Direct
		// grant must be renewed within its TTL); the file is what a pod cut
		// off from the API still has.
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		if at, err := api.Token(rctx); err != nil {
			r.APIErr = err.Error()
		} else if r.APIToken = at.Value; at.Value > tok.Value {
			tok = at
		}
		r.Token = tok.Value
		if tok.Value > 0 {
			if os.Getenv("RENEWAL") == "Direct" && heldToken != tok.Value {
				// Hold's context lives on past this round, so it takes ctx.
				if h, err := fence.Hold(ctx, t.Etcd, t.Prefix, ns, tok); err == nil {
					held, heldToken = h, tok.Value
				} else {
					r.Hold = "not taken: " + err.Error()
				}
			}
			if held != nil && held.Err() != nil {
				r.Hold = "lost: " + context.Cause(held).Error()
			}
			// A zombie writes on, whatever it knows.
			r.Attempts = t.WriteAll(ctx, tok, pod)
		}
		cancel()
		raw, _ := json.Marshal(r)
		fmt.Println(string(raw))
		time.Sleep(200 * time.Millisecond)
	}
}

// connect opens the three connections a member writes through.
func connect(ctx context.Context, ns string) (fencedwrites.Targets, error) {
	t := fencedwrites.Targets{Namespace: ns}
	token, err := os.ReadFile("/etc/member/token")
	if err != nil {
		return t, fmt.Errorf("the API token not bound to this pod: %w", err)
	}
	cfg := &rest.Config{
		Host:            "https://" + net.JoinHostPort(os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")),
		BearerToken:     string(token),
		TLSClientConfig: rest.TLSClientConfig{CAFile: "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"},
		Timeout:         3 * time.Second,
	}
	if t.Kube, err = client.New(cfg, client.Options{}); err != nil {
		return t, err
	}
	access, err := fence.LoadEtcdAccess(fence.DefaultCredentialsDir)
	if err != nil {
		return t, err
	}
	access.Config.Logger = zap.NewNop()
	if t.Etcd, err = clientv3.New(access.Config); err != nil {
		return t, err
	}
	t.Prefix = access.Prefix
	ictx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if t.Install, err = dbfence.InstallOf(ictx, t.Etcd, t.Prefix); err != nil {
		return t, err
	}
	if t.DB, err = sql.Open("pgx", os.Getenv("DSN")); err != nil {
		return t, err
	}
	t.DB.SetMaxOpenConns(2)
	return t, nil
}
