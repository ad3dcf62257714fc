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

// A write that fails (a full volume) still makes room for the next run: the
// oldest snapshot goes, so the backups do not age for ever behind a volume
// that never frees itself.
func TestSnapshotThatFailsMakesRoomForTheNext(t *testing.T) {
	cli := startEtcd(t)
	ctx := context.Background()
	dir := t.TempDir()
	start := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	for i := range 3 {
		if _, _, err := Snapshot(ctx, cli, dir, 3, start.Add(time.Duration(i)*time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	failAt := start.Add(3 * time.Hour)
	// A directory where the new file's partial copy goes: its create fails.
	if err := os.Mkdir(filepath.Join(dir, "fencer-etcd-20261130T150000Z.db.part"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Snapshot(ctx, cli, dir, 3, failAt); err == nil {
		t.Fatal("the write into a directory succeeded")
	}
	var names []string
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !e.IsDir() {
			names = append(names, e.Name())
		}
	}
	want := []string{"fencer-etcd-20261130T130000Z.db", "fencer-etcd-20261130T140000Z.db"}
	if len(names) != 2 || names[0] != want[0] || names[1] != want[1] {
		t.Fatalf("after a failed write: %v, want %v", names, want)
	}
}
