package etcdstore

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
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
	want := []string{"fencer-etcd-20261130T140000Z.db", "fencer-etcd-20261130T150000Z.db"}
	assertSnapshots(t, dir, "kept", want...)
	if filepath.Base(last) != want[1] {
		t.Errorf("last snapshot %s", last)
	}
	if _, _, err := Snapshot(ctx, cli, dir, 0, start); err == nil {
		t.Error("keep 0 accepted")
	}
}

// A write that finds the volume full still makes room for the next run:
// the oldest snapshot goes, so the backups do not age for ever behind a
// volume that never frees itself.
func TestSnapshotThatFindsTheVolumeFullMakesRoomForTheNext(t *testing.T) {
	cli := startEtcd(t)
	dir := threeSnapshots(t, cli)
	// The new file's partial copy is /dev/full: every write to it fails
	// with ENOSPC, as on a full volume.
	if err := os.Symlink("/dev/full", filepath.Join(dir, "fencer-etcd-20261130T150000Z.db.part")); err != nil {
		t.Fatal(err)
	}
	_, _, err := Snapshot(context.Background(), cli, dir, 3, time.Date(2026, 11, 30, 15, 0, 0, 0, time.UTC))
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("a write into /dev/full: %v, want ENOSPC", err)
	}
	assertSnapshots(t, dir, "after a write that found the volume full",
		"fencer-etcd-20261130T130000Z.db", "fencer-etcd-20261130T140000Z.db")
}

// Any other failed write deletes nothing. A run stalled for longer than
// abandonedPart, whose partial copy a second run took for abandoned and
// deleted, fails its rename; that must not cost a good snapshot, and room
// would not help it. Here the partial copy's name is a directory, so its
// create fails.
func TestSnapshotThatFailsOtherwiseDeletesNothing(t *testing.T) {
	cli := startEtcd(t)
	dir := threeSnapshots(t, cli)
	if err := os.Mkdir(filepath.Join(dir, "fencer-etcd-20261130T150000Z.db.part"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Snapshot(context.Background(), cli, dir, 3, time.Date(2026, 11, 30, 15, 0, 0, 0, time.UTC)); err == nil {
		t.Fatal("the write into a directory succeeded")
	}
	assertSnapshots(t, dir, "after a failed write",
		"fencer-etcd-20261130T120000Z.db", "fencer-etcd-20261130T130000Z.db", "fencer-etcd-20261130T140000Z.db")
}

// threeSnapshots writes snapshots at 12:00, 13:00 and 14:00 UTC on
// 2026-11-30 into a new directory, keeping 3.
func threeSnapshots(t *testing.T, cli *clientv3.Client) string {
	t.Helper()
	dir := t.TempDir()
	start := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	for i := range 3 {
		if _, _, err := Snapshot(context.Background(), cli, dir, 3, start.Add(time.Duration(i)*time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// assertSnapshots fails unless dir's files (not its directories, nor its
// symbolic links) are want, in order.
func assertSnapshots(t *testing.T, dir, when string, want ...string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		if e.Type().IsRegular() {
			names = append(names, e.Name())
		}
	}
	if !slices.Equal(names, want) {
		t.Fatalf("%s: %v, want %v", when, names, want)
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
