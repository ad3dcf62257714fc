package etcdstore

import (
	"context"
	"errors"
	"io/fs"
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

// A run killed mid-write (a Job past its deadline, the OOM killer) leaves
// its partial copy behind, and nothing else would ever delete it: the next
// run does, once it has gone unwritten long enough that no write is in
// progress into it. A fresh one, another run's write, stays.
func TestSnapshotDeletesPartialCopiesKilledRunsLeft(t *testing.T) {
	cli := startEtcd(t)
	dir := t.TempDir()
	abandoned := filepath.Join(dir, "fencer-etcd-20261130T110000Z.db.part")
	writing := filepath.Join(dir, "fencer-etcd-20261130T115959Z.db.part")
	for _, p := range []string{abandoned, writing} {
		if err := os.WriteFile(p, []byte("half a snapshot"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	old := time.Now().Add(-abandonedPart - time.Minute)
	if err := os.Chtimes(abandoned, old, old); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Snapshot(context.Background(), cli, dir, 2, time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(abandoned); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the killed run's partial copy: %v, want it deleted", err)
	}
	if _, err := os.Stat(writing); err != nil {
		t.Errorf("a partial copy still being written: %v, want it kept", err)
	}
}
