// Command worker is the real node's test workload: a holder of fencer Lease
// $LEASE that reads its token as a workload would, from its Downward API
// file and from the API (PodSource), and, on each new tenure, writes the
// fenced ConfigMap report-output with that token. It prints one JSON line
// per observation, which the test reads from the container's log.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/config"

	"github.com/fencer-io/fencer/pkg/fence"
)

type line struct {
	Pod       string `json:"pod"`
	At        string `json:"at"`
	FileToken int64  `json:"fileToken"`
	APIToken  int64  `json:"apiToken"`
	Wrote     int64  `json:"wrote,omitempty"`
	Err       string `json:"err,omitempty"`
}

func main() {
	pod, ns, lease := os.Getenv("POD_NAME"), os.Getenv("POD_NAMESPACE"), os.Getenv("LEASE")
	cfg, err := config.GetConfig()
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(1)
	}
	cl, err := client.New(cfg, client.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(1)
	}
	file := fence.FileSource{Path: "/etc/podinfo/annotations", Lease: lease}
	api := fence.PodSource{Client: cl, Namespace: ns, Pod: pod, UID: types.UID(os.Getenv("POD_UID")), Lease: lease}
	var wrote int64
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		l := line{Pod: pod, At: time.Now().UTC().Format(time.RFC3339Nano)}
		ft, ferr := file.Token(ctx)
		at, aerr := api.Token(ctx)
		l.FileToken, l.APIToken = ft.Value, at.Value
		switch {
		case errors.Is(ferr, fence.ErrNotHolder) && errors.Is(aerr, fence.ErrNotHolder):
		case ferr != nil || aerr != nil:
			l.Err = fmt.Sprintf("file: %v; api: %v", ferr, aerr)
		case ft.Value != wrote && ft.Value == at.Value:
			if err := write(ctx, fence.NewClient(cl, ft), ns, pod, ft.Value); err != nil {
				l.Err = err.Error()
			} else {
				wrote, l.Wrote = ft.Value, ft.Value
			}
		}
		cancel()
		raw, _ := json.Marshal(l)
		fmt.Println(string(raw))
		time.Sleep(200 * time.Millisecond)
	}
}

// write creates or updates the fenced ConfigMap; fence.Client sends the
// token with every write, and the webhook checks it.
func write(ctx context.Context, c *fence.Client, ns, pod string, token int64) error {
	cm := &corev1.ConfigMap{}
	err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "report-output"}, cm)
	data := map[string]string{"writer": pod, "token": strconv.FormatInt(token, 10)}
	if apierrors.IsNotFound(err) {
		cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "report-output"}, Data: data}
		return c.Create(ctx, cm)
	}
	if err != nil {
		return err
	}
	cm.Data = data
	return c.Update(ctx, cm)
}
