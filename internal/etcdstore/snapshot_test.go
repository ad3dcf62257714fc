package etcdstore

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestSnapshotWritesCompleteFilesAndKeepsTheNewest(t *testing.T) {
	cli := startEtcd(t)
	ctx := context.Background()
	if _, err := cli.Put(ctx, "/fencer/leases/ns/report", "{}"); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	start := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	var last string
	for i := range 4 {
		path, size, err := Snapshot(ctx, cli, dir, 2, start.Add(time.Duration(i)*time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		if size == 0 {
			t.Fatalf("snapshot %s is empty", path)
		}
		last = path
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	want := []string{"fencer-etcd-20261130T140000Z.db", "fencer-etcd-20261130T150000Z.db"}
	if len(names) != 2 || names[0] != want[0] || names[1] != want[1] {
		t.Fatalf("kept %v, want %v", names, want)
	}
	if filepath.Base(last) != want[1] {
		t.Errorf("last snapshot %s", last)
	}
	if _, _, err := Snapshot(ctx, cli, dir, 0, start); err == nil {
		t.Error("keep 0 accepted")
	}
}
