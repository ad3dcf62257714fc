package idgen_test

import (
	"context"
	"errors"
	"log"
	"os"

	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/apimachinery/pkg/types"

	"github.com/fencer-io/fencer/pkg/idgen"
)

// Hand out IDs from blocks of a Blocks-mode IDRange, straight from etcd.
func ExampleNewBlocks() {
	cli, _ := clientv3.New(clientv3.Config{Endpoints: []string{"http://127.0.0.1:2379"}})
	ids, err := idgen.NewBlocks(cli, idgen.BlockOptions{
		Namespace: "default", Name: "order-ids", Min: 1, Max: 1_000_000_000, BlockSize: 100_000,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer ids.Close()
	id, err := ids.Next(context.Background())
	if errors.Is(err, idgen.ErrExhausted) {
		log.Fatal("grow spec.max of the IDRange")
	}
	log.Print(id)
}

// Issue snowflake IDs on the slot fencer leased to this pod.
func ExampleNewSnowflake() {
	var cli *clientv3.Client
	slot, token, err := idgen.ParseSlot("slot=7,token=1234") // the pod's idrange.fencer.io/<name> annotation
	if err != nil {
		log.Fatal(err)
	}
	gen, err := idgen.NewSnowflake(context.Background(), cli, idgen.SnowflakeOptions{
		Namespace: "default", Name: "event-workers", Slot: slot, Token: token,
		PodUID: types.UID(os.Getenv("POD_UID")), // the Downward API's metadata.uid
	})
	if err != nil {
		log.Fatal(err)
	}
	defer gen.Close()
	id, err := gen.Next(context.Background())
	var rollback *idgen.ClockRollbackError
	switch {
	case errors.Is(err, idgen.ErrSlotLost):
		log.Fatal("the slot moved on; restart to lease a new one")
	case errors.As(err, &rollback):
		log.Fatalf("clock went back %s", rollback.Back)
	}
	log.Print(id)
}
