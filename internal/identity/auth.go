package identity

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"go.etcd.io/etcd/api/v3/authpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/apimachinery/pkg/types"

	"github.com/fencer-io/fencer/pkg/etcdkeys"
)

// etcd's built-in superuser and its role. Enabling auth needs the user
// root with the role root; fencer creates root without a password and never
// issues it a certificate, so nobody logs in as root.
const rootName = "root"

// ManagerUser is the etcd user (and certificate CommonName) of the fencer
// manager of the install whose keys live below prefix. It holds the root
// role: it grants leases under every namespace, maintains etcd (compaction,
// defragmentation, alarms) and manages the namespace users.
func ManagerUser(prefix string) string { return installName(prefix) + ":manager" }

// BackupUser is the etcd user of the scheduled snapshot job. etcd lets only
// the root role take snapshots, so it holds the root role too.
func BackupUser(prefix string) string { return installName(prefix) + ":backup" }

// NamespaceRole is the etcd role of the workloads of namespace ns: the keys
// they may use.
func NamespaceRole(prefix, ns string) string { return installName(prefix) + ":ns:" + ns }

// NamespaceUser is the etcd user (and certificate CommonName) of the
// workloads of namespace ns, the object with UID uid. The UID is part of
// the name because etcd cannot revoke a certificate: a certificate issued
// for a namespace since deleted (valid for up to CertLifetime, and perhaps
// leaked) must not open the keys of a new namespace created under the same
// name, as it would if the name alone made the user.
func NamespaceUser(prefix, ns string, uid types.UID) string {
	return NamespaceRole(prefix, ns) + ":" + string(uid)
}

// installName keeps the users of two installs sharing one etcd (with
// different prefixes) apart: /fencer gives "fencer", /a/b gives "a/b".
func installName(prefix string) string {
	return strings.TrimPrefix(etcdkeys.OrDefault(prefix), "/")
}

// Permission is one key range a role may use.
type Permission struct {
	// Prefix is the key prefix the permission covers; with Exact, the one key.
	Prefix string
	// Exact covers the key Prefix alone.
	Exact bool
	// Write allows writes too; otherwise the range is read-only.
	Write bool
}

func (p Permission) rangeEnd() string {
	if p.Exact {
		return ""
	}
	return clientv3.GetPrefixRangeEnd(p.Prefix)
}

// NamespacePermissions are all a namespace's workloads may do: read their
// Lease keys (to compare tokens, watch and hold them) but never write them,
// since a written lease key would be a forged token; use their IDRanges
// (claim blocks, mark consumed ones, write a slot's clock) and read the
// controller's block claim records, never write them; keep fenced data
// keys below DataPrefix; take the namespace's keyed locks, and read the
// lock floor the manager sets after etcd went back in time. Nothing of any
// other namespace.
//
// The one exception is the key of each Lease in directLeases (renewal
// Direct): etcd lets only a user who may write every key attached to an
// etcd lease keep that lease alive, so Direct holders need write on their
// Lease's key and on no other.
func NamespacePermissions(prefix, ns string, directLeases []string) []Permission {
	prefix = etcdkeys.OrDefault(prefix)
	perms := []Permission{
		{Prefix: etcdkeys.NamespaceLeasesPrefix(prefix, ns)},
		// Read only: the controller's grant markers, which tell its grants
		// from a lease key a Direct holder re-created (the SDK's fence
		// compares them).
		{Prefix: etcdkeys.NamespaceGrantMarkersPrefix(prefix, ns)},
		{Prefix: etcdkeys.NamespaceIDRangesPrefix(prefix, ns), Write: true},
		// Read only: the controller's records of whom each block is for.
		{Prefix: etcdkeys.NamespaceClaimsPrefix(prefix, ns)},
		{Prefix: etcdkeys.DataPrefix(prefix, ns), Write: true},
		// Keyed locks: queue, hold and release the namespace's own.
		{Prefix: etcdkeys.NamespaceLocksPrefix(prefix, ns), Write: true},
		// Read only: the revision below which no keyed lock is granted.
		{Prefix: etcdkeys.LockFloorKey(prefix), Exact: true},
	}
	for _, name := range directLeases {
		perms = append(perms, Permission{Prefix: etcdkeys.LeaseKey(prefix, ns, name), Exact: true, Write: true})
	}
	return perms
}

// EnableAuth turns etcd authentication on, with each of root (the
// manager's user first) holding the root role. It is idempotent and safe
// to run from several replicas at once. cli must be allowed to do it:
// before auth is on anyone is; after, only a root-role user (the manager
// itself, through its certificate).
func EnableAuth(ctx context.Context, cli *clientv3.Client, root ...string) error {
	for _, user := range append([]string{rootName}, root...) {
		if err := ensureUser(ctx, cli, user); err != nil {
			return err
		}
		if _, err := cli.UserGrantRole(ctx, user, rootName); err != nil && !errors.Is(err, rpctypes.ErrRoleAlreadyExist) {
			return fmt.Errorf("granting etcd role root to %s: %w", user, err)
		}
	}
	st, err := cli.AuthStatus(ctx)
	if err != nil {
		return fmt.Errorf("etcd auth status: %w", err)
	}
	if st.Enabled {
		return nil
	}
	if _, err := cli.AuthEnable(ctx); err != nil {
		return fmt.Errorf("enabling etcd auth: %w", err)
	}
	return nil
}

// EnsureNamespace makes the etcd role of namespace ns hold exactly
// NamespacePermissions (missing grants are added, stray ones revoked), and
// the user of the namespace object uid hold that role. The user of another
// namespace object of that name (deleted while no manager removed its
// identity) is deleted. The user named like the role, which releases
// before the UID was part of the name issued, keeps the role until the
// identity is removed or a user of another namespace object is found, so
// pods holding its certificate keep working through an upgrade. The caller
// must have read uid from the apiserver just before, and read it again
// after: a uid read before the namespace was created again would delete
// the new object's user (IdentityReconciler looks again).
func EnsureNamespace(ctx context.Context, cli *clientv3.Client, prefix, ns string, uid types.UID, directLeases []string) error {
	if uid == "" {
		return fmt.Errorf("the etcd identity of namespace %s needs the namespace's UID", ns)
	}
	role := NamespaceRole(prefix, ns)
	if err := ensureRole(ctx, cli, role, NamespacePermissions(prefix, ns, directLeases)); err != nil {
		return err
	}
	user := NamespaceUser(prefix, ns, uid)
	if err := grantUser(ctx, cli, user, role); err != nil {
		return err
	}
	users, err := namespaceUsers(ctx, cli, prefix, ns)
	if err != nil {
		return err
	}
	// A user of another namespace object proves that the name was taken by
	// another object since the upgrade: the earlier release's user may be
	// that object's, so it goes too.
	others := slices.ContainsFunc(users, func(u string) bool { return u != user && u != role })
	for _, u := range users {
		if u != user && (u != role || others) {
			if err := deleteUser(ctx, cli, u); err != nil {
				return err
			}
		}
	}
	return nil
}

// ViewerUser is the etcd user that reads the install's keyed locks and
// nothing else: `kubectl fencer locks` connects as it.
func ViewerUser(prefix string) string { return installName(prefix) + ":viewer" }

// ViewerPermissions are the viewer's: read the keyed locks of every
// namespace and the lock floor. Never a write.
func ViewerPermissions(prefix string) []Permission {
	prefix = etcdkeys.OrDefault(prefix)
	return []Permission{{Prefix: etcdkeys.LocksPrefix(prefix)}, {Prefix: etcdkeys.LockFloorKey(prefix), Exact: true}}
}

// EnsureViewer makes the viewer's etcd user and role hold exactly
// ViewerPermissions.
func EnsureViewer(ctx context.Context, cli *clientv3.Client, prefix string) error {
	return ensureRoleUser(ctx, cli, ViewerUser(prefix), ViewerPermissions(prefix))
}

// ensureRoleUser makes the user name hold the role name, and the role
// exactly perms.
func ensureRoleUser(ctx context.Context, cli *clientv3.Client, name string, perms []Permission) error {
	if err := ensureRole(ctx, cli, name, perms); err != nil {
		return err
	}
	return grantUser(ctx, cli, name, name)
}

// ensureRole makes the role name hold exactly perms.
func ensureRole(ctx context.Context, cli *clientv3.Client, name string, perms []Permission) error {
	if _, err := cli.RoleAdd(ctx, name); err != nil && !errors.Is(err, rpctypes.ErrRoleAlreadyExist) {
		return fmt.Errorf("adding etcd role %s: %w", name, err)
	}
	role, err := cli.RoleGet(ctx, name)
	if err != nil {
		return fmt.Errorf("reading etcd role %s: %w", name, err)
	}
	return syncPermissions(ctx, cli, name, role.Perm, perms)
}

// grantUser makes the user name exist and hold role.
func grantUser(ctx context.Context, cli *clientv3.Client, name, role string) error {
	if err := ensureUser(ctx, cli, name); err != nil {
		return err
	}
	if _, err := cli.UserGrantRole(ctx, name, role); err != nil {
		return fmt.Errorf("granting etcd role %s to %s: %w", role, name, err)
	}
	return nil
}

func deleteUser(ctx context.Context, cli *clientv3.Client, name string) error {
	if _, err := cli.UserDelete(ctx, name); err != nil && !errors.Is(err, rpctypes.ErrUserNotFound) {
		return fmt.Errorf("deleting etcd user %s: %w", name, err)
	}
	return nil
}

// RemoveNamespace deletes every etcd user of namespace ns, whatever its
// namespace object, and its role, so a certificate issued for it no longer
// opens anything. Absent is fine.
func RemoveNamespace(ctx context.Context, cli *clientv3.Client, prefix, ns string) error {
	users, err := namespaceUsers(ctx, cli, prefix, ns)
	if err != nil {
		return err
	}
	for _, u := range users {
		if err := deleteUser(ctx, cli, u); err != nil {
			return err
		}
	}
	role := NamespaceRole(prefix, ns)
	if _, err := cli.RoleDelete(ctx, role); err != nil && !errors.Is(err, rpctypes.ErrRoleNotFound) {
		return fmt.Errorf("deleting etcd role %s: %w", role, err)
	}
	return nil
}

// namespaceUsers lists the etcd users of namespace ns: one per namespace
// object (NamespaceUser), and the one named like the role that earlier
// releases issued.
func namespaceUsers(ctx context.Context, cli *clientv3.Client, prefix, ns string) ([]string, error) {
	resp, err := cli.UserList(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing etcd users: %w", err)
	}
	var out []string
	for _, u := range resp.Users {
		if of, ok := userNamespace(prefix, u); ok && of == ns {
			out = append(out, u)
		}
	}
	return out, nil
}

// userNamespace is the namespace whose etcd user u is: <prefix>:ns:<ns>,
// or <prefix>:ns:<ns>:<uid>. A namespace name has no ':'.
func userNamespace(prefix, u string) (string, bool) {
	rest, ok := strings.CutPrefix(u, NamespaceRole(prefix, ""))
	ns, _, _ := strings.Cut(rest, ":")
	return ns, ok && ns != ""
}

func syncPermissions(ctx context.Context, cli *clientv3.Client, role string, have []*authpb.Permission, want []Permission) error {
	type grant struct {
		end string
		typ authpb.Permission_Type
	}
	wanted := map[string]grant{}
	for _, p := range want {
		g := grant{end: p.rangeEnd(), typ: authpb.READ}
		if p.Write {
			g.typ = authpb.READWRITE
		}
		wanted[p.Prefix] = g
	}
	for _, p := range have {
		key, end := string(p.Key), string(p.RangeEnd)
		if g, ok := wanted[key]; ok && g.end == end && g.typ == p.PermType {
			delete(wanted, key)
			continue
		}
		if _, err := cli.RoleRevokePermission(ctx, role, key, end); err != nil {
			return fmt.Errorf("revoking %q from etcd role %s: %w", key, role, err)
		}
	}
	for key, g := range wanted {
		if _, err := cli.RoleGrantPermission(ctx, role, key, g.end, clientv3.PermissionType(g.typ)); err != nil {
			return fmt.Errorf("granting %q to etcd role %s: %w", key, role, err)
		}
	}
	return nil
}

// ensureUser adds a user without a password: it can only authenticate with a
// client certificate whose CommonName is its name.
func ensureUser(ctx context.Context, cli *clientv3.Client, name string) error {
	_, err := cli.UserAddWithOptions(ctx, name, "", &clientv3.UserAddOptions{NoPassword: true})
	if err != nil && !errors.Is(err, rpctypes.ErrUserAlreadyExist) {
		return fmt.Errorf("adding etcd user %s: %w", name, err)
	}
	return nil
}

// Namespaces lists the namespaces that have an etcd user of this install,
// so that identities whose namespace lost its last fencer object while no
// manager was watching are found and removed.
func Namespaces(ctx context.Context, cli *clientv3.Client, prefix string) ([]string, error) {
	resp, err := cli.UserList(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing etcd users: %w", err)
	}
	var out []string
	for _, u := range resp.Users {
		if ns, ok := userNamespace(prefix, u); ok && !slices.Contains(out, ns) {
			out = append(out, ns)
		}
	}
	return out, nil
}
