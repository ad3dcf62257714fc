package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// snapshotPrefix and snapshotSuffix name the files Snapshot writes; their
// UTC timestamp in between sorts them oldest first.
const (
	snapshotPrefix = "fencer-etcd-"
	snapshotSuffix = ".db"
)

// Snapshot saves a snapshot of etcd into dir as fencer-etcd-<UTC time>.db
// and deletes all but the newest keep snapshots there. The file appears
// under its name only once complete and synced, so a crash mid-way leaves
// no truncated snapshot to restore from. When the write fails because the
// volume is full (or over its quota), all but the newest keep-1 (at least
// one) are deleted, so that the next run has room: otherwise pruning, which
// follows a written snapshot, would never come again. Any other failure
// deletes nothing: a run whose partial copy a second run took for abandoned
// (it stalled for longer than abandonedPart) must not cost a good snapshot.
// Restore one with etcdutl (docs/operations.md), always with --bump-revision.
func Snapshot(ctx context.Context, cli *clientv3.Client, dir string, keep int, now time.Time) (path string, size int64, err error) {
	if keep < 1 {
		return "", 0, fmt.Errorf("keep must be at least 1, got %d", keep)
	}
	rc, err := cli.Snapshot(ctx)
	if err != nil {
		return "", 0, fmt.Errorf("etcd snapshot: %w", err)
	}
	defer rc.Close()
	path = filepath.Join(dir, snapshotPrefix+now.UTC().Format("20060102T150405Z")+snapshotSuffix)
	if size, err = writeSynced(path, rc); err != nil {
		if !outOfSpace(err) {
			return "", 0, err
		}
		if perr := prune(dir, max(keep-1, 1)); perr != nil {
			err = fmt.Errorf("%w; making room for the next: %w", err, perr)
		}
		return "", 0, err
	}
	return path, size, prune(dir, keep)
}

// outOfSpace tells whether err says the volume, or the user's quota on it,
// is full: the one failure that deleting an old snapshot can cure.
func outOfSpace(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

func writeSynced(path string, r io.Reader) (int64, error) {
	part := path + ".part"
	f, err := os.Create(part)
	if err != nil {
		return 0, err
	}
	n, err := io.Copy(f, r)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(part, path)
	}
	if err != nil {
		os.Remove(part)
		return 0, fmt.Errorf("writing snapshot %s: %w", path, err)
	}
	return n, nil
}

// abandonedPart is how long a partial copy may go unwritten before prune
// takes it for one a killed run left (a Job past its deadline, the OOM
// killer): a write in progress streams into it all the time, and nothing
// else would ever delete it.
const abandonedPart = 10 * time.Minute

// prune deletes all but the newest keep snapshots in dir, and the partial
// copies killed runs left there.
func prune(dir string, keep int) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var snaps []string
	for _, e := range entries {
		n := e.Name()
		if !strings.HasPrefix(n, snapshotPrefix) || e.IsDir() {
			continue
		}
		if strings.HasSuffix(n, snapshotSuffix) {
			snaps = append(snaps, n)
		} else if strings.HasSuffix(n, snapshotSuffix+".part") {
			if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > abandonedPart {
				if err := os.Remove(filepath.Join(dir, n)); err != nil && !errors.Is(err, fs.ErrNotExist) {
					return err
				}
			}
		}
	}
	sort.Strings(snaps)
	for len(snaps) > keep {
		if err := os.Remove(filepath.Join(dir, snaps[0])); err != nil {
			return err
		}
		snaps = snaps[1:]
	}
	return nil
}
