// Command ids is the real node's IDRange consumer. It issues IDs the way
// docs/idranges.md tells a Blocks-mode consumer to: the block annotated on
// its pod only once per pod (idgen.ConsumeBlock), and after a restart from
// blocks it claims itself (idgen.NewBlocks). Every ID is appended to
// /data/issued, on an emptyDir that outlives the container, before it counts
// as issued; the test kills the process and checks the file for repeats.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/apimachinery/pkg/types"

	"github.com/fencer-io/fencer/pkg/fence"
	"github.com/fencer-io/fencer/pkg/idgen"
)

func main() {
	if err := run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "ids:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	ns, pod, name := os.Getenv("POD_NAMESPACE"), os.Getenv("POD_NAME"), os.Getenv("IDRANGE")
	access, err := fence.LoadEtcdAccess(fence.DefaultCredentialsDir)
	if err != nil {
		return err
	}
	cli, err := clientv3.New(access.Config)
	if err != nil {
		return err
	}
	defer cli.Close()
	out, err := os.OpenFile("/data/issued", os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	next, source, err := allocator(ctx, cli, access.Prefix, ns, pod, name)
	if err != nil {
		return err
	}
	fmt.Println("issuing from", source)
	for {
		id, err := next(ctx)
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintf(out, "%d %s\n", id, source); err != nil {
			return err
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// allocator returns the annotated block's IDs if this is the first start
// to consume it, and otherwise an allocator of the container's own blocks.
func allocator(ctx context.Context, cli *clientv3.Client, prefix, ns, pod, name string) (func(context.Context) (int64, error), string, error) {
	annotation, err := waitAnnotation("idrange.fencer.io/" + name)
	if err != nil {
		return nil, "", err
	}
	block, err := idgen.ConsumeBlock(ctx, cli, prefix, ns, name, annotation, types.UID(os.Getenv("POD_UID")))
	if err == nil {
		id := block.First - 1
		return func(context.Context) (int64, error) {
			if id == block.Last {
				return 0, errors.New("the annotated block is used up")
			}
			id++
			return id, nil
		}, "annotated", nil
	}
	if !errors.Is(err, idgen.ErrBlockConsumed) {
		return nil, "", err
	}
	fmt.Println(err)
	blocks, err := idgen.NewBlocks(cli, idgen.BlockOptions{
		Prefix: prefix, Namespace: ns, Name: name,
		Min: envInt("MIN"), Max: envInt("MAX"), BlockSize: envInt("BLOCK_SIZE"),
	})
	if err != nil {
		return nil, "", err
	}
	return blocks.Next, "claimed", nil
}

// waitAnnotation reads the pod's annotation from its Downward API file,
// which has it once the controller has granted the pod a block.
func waitAnnotation(key string) (string, error) {
	for {
		raw, err := os.ReadFile("/etc/podinfo/annotations")
		if err != nil {
			return "", err
		}
		annotations, err := fence.ParseAnnotations(raw)
		if err != nil {
			return "", err
		}
		if v, ok := annotations[key]; ok {
			return v, nil
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func envInt(name string) int64 {
	n, _ := strconv.ParseInt(os.Getenv(name), 10, 64)
	return n
}
