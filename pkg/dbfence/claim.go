package dbfence

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-io/fencer/internal/etcdreply"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
)

// Claim raises res's floor to token in a transaction of its own, at the
// start of a tenure, before any write. The fence is per resource: without
// it, a stale holder writing a resource its successor has not written yet
// still commits. After Claim every transaction under an older token is
// refused, written or not.
func (t Table) Claim(ctx context.Context, db *sql.DB, res Resource, token int64) error {
	if db == nil {
		return errors.New("dbfence: Claim needs the database (a *sql.DB): it runs its own transaction")
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if err := t.Guard(ctx, tx, res, token); err != nil {
		return err
	}
	return tx.Commit()
}

// InstallOf names the install whose tokens cli's etcd issues: its key
// prefix and etcd cluster ID, as Resource.Install. It reads one key a
// namespace's identity may read (the lock floor); every etcd answer
// carries the cluster ID.
func InstallOf(ctx context.Context, cli *clientv3.Client, prefix string) (string, error) {
	if cli == nil {
		return "", errors.New("dbfence: InstallOf needs an etcd client (fence.LoadEtcdAccess makes one)")
	}
	prefix = etcdkeys.OrDefault(prefix)
	if err := etcdkeys.CheckPrefix(prefix); err != nil {
		return "", fmt.Errorf("dbfence: InstallOf: %w", err)
	}
	resp, err := cli.Get(ctx, etcdkeys.LockFloorKey(prefix), clientv3.WithCountOnly())
	if err != nil {
		return "", fmt.Errorf("dbfence: reading etcd's cluster ID: %w", err)
	}
	if resp.Header == nil || resp.Header.ClusterId == 0 {
		// Never "prefix@0": tokens guarded under another install's name go
		// to rows of their own and are never compared with this install's,
		// so that name would not fence writes guarded under the real one.
		return "", fmt.Errorf("dbfence: reading etcd's cluster ID: %w: no cluster ID in the header", etcdreply.ErrMalformed)
	}
	return fmt.Sprintf("%s@%x", prefix, resp.Header.ClusterId), nil
}
