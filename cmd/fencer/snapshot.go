package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/fencer-io/fencer/internal/etcdstore"
)

// snapshotCommand is `fencer snapshot`: the chart's backup CronJob runs it
// to save a snapshot of fencer's etcd to a volume.
func snapshotCommand(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("fencer snapshot", flag.ContinueOnError)
	fs.SetOutput(out)
	var cfg etcdstore.Config
	cfg.BindFlags(fs)
	dir := fs.String("dir", "/backup", "Directory to write fencer-etcd-<UTC time>.db into.")
	keep := fs.Int("keep", 7, "How many snapshots to keep in --dir; older ones are deleted. When the write finds the volume full (or over its quota), all but the newest keep-1 (at least one) are deleted, so that a retry has room; any other failure deletes nothing.")
	timeout := fs.Duration("timeout", 10*time.Minute, "Give up if the snapshot takes longer.")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "fencer snapshot: save a snapshot of fencer's etcd (docs/operations.md, Backup).\n\nUsage: fencer snapshot --etcd-endpoints=URL [flags]\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *keep < 1 {
		return fmt.Errorf("--keep must be at least 1, got %d", *keep)
	}
	if st, err := os.Stat(*dir); err != nil || !st.IsDir() {
		return fmt.Errorf("--dir %s must be an existing directory (mount the backup volume there)", *dir)
	}
	cli, err := etcdstore.Connect(cfg)
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	path, size, err := etcdstore.Snapshot(ctx, cli, *dir, *keep, time.Now())
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "saved %s (%d bytes); keeping the newest %d\n", path, size, *keep)
	return nil
}

// subcommand runs `fencer <name> ...` if args name one, and reports whether it did.
func subcommand(args []string) (ran bool, code int) {
	if len(args) == 0 || args[0] != "snapshot" {
		return false, 0
	}
	err := snapshotCommand(args[1:], os.Stdout)
	switch {
	case errors.Is(err, flag.ErrHelp):
		return true, 0
	case err != nil:
		fmt.Fprintf(os.Stderr, "fencer snapshot: %v\n", err)
		return true, 1
	}
	return true, 0
}
