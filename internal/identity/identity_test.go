package identity_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/apimachinery/pkg/types"

	"github.com/fencer-io/fencer/internal/identity"
	"github.com/fencer-io/fencer/pkg/etcdkeys"
	"github.com/fencer-io/fencer/pkg/fence"
	"github.com/fencer-io/fencer/test/support/devcluster"
	"github.com/fencer-io/fencer/test/support/testenv"
)

const prefix = "/fencer"

// isolated sets up namespaces a and b the way the manager does, with a
// granted lease in each, and returns the manager's client and a client
// holding namespace a's identity.
func isolated(t *testing.T) (etcd *testenv.SecureEtcd, mgr, a *clientv3.Client, lease clientv3.LeaseID, tokenA int64) {
	t.Helper()
	ctx := context.Background()
	etcd = testenv.StartSecureEtcd(t, prefix)
	mgr = etcd.Client(t, "manager")
	for _, ns := range []string{"a", "b"} {
		if err := identity.EnsureNamespace(ctx, mgr, prefix, ns, uidOf(ns), []string{"direct"}); err != nil {
			t.Fatal(err)
		}
	}
	// Twice: the second run must find everything in place.
	if err := identity.EnsureNamespace(ctx, mgr, prefix, "a", uidOf("a"), []string{"direct"}); err != nil {
		t.Fatalf("EnsureNamespace is not idempotent: %v", err)
	}
	g, err := mgr.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	// As the controller grants: the key and its grant marker together.
	resp, err := mgr.Txn(ctx).Then(
		clientv3.OpPut(etcdkeys.LeaseKey(prefix, "a", "l"), `{}`, clientv3.WithLease(g.ID)),
		clientv3.OpPut(etcdkeys.GrantMarkerKey(prefix, "a", "l"), ""),
	).Commit()
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{"b"} {
		mustPut(t, mgr, etcdkeys.LeaseKey(prefix, ns, "l"), "{}")
		mustPut(t, mgr, etcdkeys.GrantMarkerKey(prefix, ns, "l"), "")
		mustPut(t, mgr, etcdkeys.IDRangeNextKey(prefix, ns, "ids"), "1")
	}
	mustPut(t, mgr, etcdkeys.IDRangeNextKey(prefix, "a", "ids"), "1")
	if err := etcd.PKI.Issue("a", identity.Request{CommonName: identity.NamespaceUser(prefix, "a", uidOf("a"))}); err != nil {
		t.Fatal(err)
	}
	return etcd, mgr, etcd.Client(t, "a"), g.ID, resp.Header.Revision
}

func mustPut(t *testing.T, cli *clientv3.Client, key, val string) {
	t.Helper()
	if _, err := cli.Put(context.Background(), key, val); err != nil {
		t.Fatalf("put %s: %v", key, err)
	}
}

func denied(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Errorf("%s: want permission denied, got %v", what, err)
	}
}

func allowed(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Errorf("%s: want allowed, got %v", what, err)
	}
}

// mustGrantB grants b's Direct Lease an etcd lease and returns it.
func mustGrantB(t *testing.T, etcd *testenv.SecureEtcd) clientv3.LeaseID {
	t.Helper()
	mgr := etcd.Client(t, "manager")
	g, err := mgr.Grant(context.Background(), 60)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mgr.Put(context.Background(), etcdkeys.LeaseKey(prefix, "b", "direct"), "{}", clientv3.WithLease(g.ID)); err != nil {
		t.Fatal(err)
	}
	return g.ID
}

func TestNamespaceIdentityReachesOnlyItsNamespace(t *testing.T) {
	etcd, _, a, _, tokenA := isolated(t)
	ctx := context.Background()

	// Its own namespace: read the lease, use the IDRange and data keys.
	_, err := a.Get(ctx, etcdkeys.LeaseKey(prefix, "a", "l"))
	allowed(t, "read own lease key", err)
	_, err = a.Get(ctx, etcdkeys.NamespaceLeasesPrefix(prefix, "a"), clientv3.WithPrefix())
	allowed(t, "list own lease keys", err)
	_, err = a.Put(ctx, etcdkeys.IDRangeNextKey(prefix, "a", "ids"), "100")
	allowed(t, "claim from own IDRange", err)
	tok := fence.Token{Lease: "l", Value: tokenA}
	resp, err := fence.NewTxn(a, prefix, "a", tok).Then(clientv3.OpPut(etcdkeys.DataPrefix(prefix, "a")+"report", "v1")).Commit(ctx)
	allowed(t, "fenced write to own data key", err)
	if err == nil && !resp.Succeeded {
		t.Error("fenced write under the live token did not succeed")
	}

	// Its own lease keys are read-only: writing one would forge a token.
	_, err = a.Put(ctx, etcdkeys.LeaseKey(prefix, "a", "l"), "{}")
	denied(t, "overwrite own lease key", err)
	_, err = a.Put(ctx, etcdkeys.LeaseKey(prefix, "a", "new"), "{}")
	denied(t, "create a lease key", err)
	_, err = a.Delete(ctx, etcdkeys.LeaseKey(prefix, "a", "l"))
	denied(t, "delete own lease key", err)
	// Grant markers are read-only: the fence compares them, and writing
	// one would make a lease key created again pass for a grant.
	_, err = a.Get(ctx, etcdkeys.GrantMarkerKey(prefix, "a", "l"))
	allowed(t, "read own grant marker", err)
	_, err = a.Put(ctx, etcdkeys.GrantMarkerKey(prefix, "a", "l"), "")
	denied(t, "forge own grant marker", err)
	_, err = a.Get(ctx, etcdkeys.GrantMarkerKey(prefix, "b", "l"))
	denied(t, "read b's grant marker", err)
	// Block claim records are read-only: writing one would make a forged
	// block annotation pass idgen.ConsumeBlock.
	_, err = a.Get(ctx, etcdkeys.IDRangeClaimKey(prefix, "a", "ids", 1))
	allowed(t, "read own block claim records", err)
	_, err = a.Put(ctx, etcdkeys.IDRangeClaimKey(prefix, "a", "ids", 2), `{"pod":"p","podUID":"u","last":999999}`)
	denied(t, "forge a block claim record", err)
	_, err = a.Get(ctx, etcdkeys.IDRangeClaimKey(prefix, "b", "ids", 1))
	denied(t, "read b's block claim records", err)

	// Nothing of namespace b.
	_, err = a.Get(ctx, etcdkeys.LeaseKey(prefix, "b", "l"))
	denied(t, "read b's lease key", err)
	_, err = a.Get(ctx, etcdkeys.IDRangeNextKey(prefix, "b", "ids"))
	denied(t, "read b's IDRange", err)
	_, err = a.KeepAliveOnce(ctx, mustGrantB(t, etcd))
	denied(t, "keep b's Direct grant alive", err)
	_, err = a.Put(ctx, etcdkeys.IDRangeNextKey(prefix, "b", "ids"), "1")
	denied(t, "lower b's IDRange", err)
	_, err = a.Put(ctx, etcdkeys.DataPrefix(prefix, "b")+"report", "x")
	denied(t, "write b's data key", err)
	_, err = a.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(etcdkeys.LeaseKey(prefix, "b", "l")), ">", 0)).
		Then(clientv3.OpPut(etcdkeys.DataPrefix(prefix, "a")+"x", "1")).Commit()
	denied(t, "compare against b's lease key", err)

	// Nor anything above the namespaces.
	_, err = a.Get(ctx, prefix+"/", clientv3.WithPrefix())
	denied(t, "read every key", err)
	_, err = a.Get(ctx, etcdkeys.LeaderKey(prefix))
	denied(t, "read the controller's election key", err)
	_, err = a.Get(ctx, "/registry/", clientv3.WithPrefix())
	denied(t, "read outside the prefix", err)
}

func TestNamespaceIdentityCannotAdministerEtcd(t *testing.T) {
	_, _, a, lease, _ := isolated(t)
	ctx := context.Background()
	_, err := a.UserAddWithOptions(ctx, "evil", "", &clientv3.UserAddOptions{NoPassword: true})
	denied(t, "add a user", err)
	_, err = a.RoleGrantPermission(ctx, identity.NamespaceRole(prefix, "a"), prefix+"/", clientv3.GetPrefixRangeEnd(prefix+"/"), clientv3.PermissionType(clientv3.PermReadWrite))
	denied(t, "widen its own role", err)
	_, err = a.AuthDisable(ctx)
	denied(t, "turn auth off", err)
	_, err = a.Revoke(ctx, lease)
	denied(t, "revoke the grant's etcd lease", err)
	_, err = a.KeepAliveOnce(ctx, lease)
	denied(t, "keep a PodReady grant alive", err)
	_, err = a.Compact(ctx, 1)
	denied(t, "compact", err)
}

// A Direct Lease's holder renews its grant itself, which etcd allows only
// to a user who may write the grant's key: that one key, and only while
// the Lease is Direct.
func TestDirectLeaseKeyIsTheOnlyWritableLeaseKey(t *testing.T) {
	etcd, mgr, a, _, _ := isolated(t)
	ctx := context.Background()
	g, err := mgr.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mgr.Put(ctx, etcdkeys.LeaseKey(prefix, "a", "direct"), "{}", clientv3.WithLease(g.ID)); err != nil {
		t.Fatal(err)
	}
	_, err = a.KeepAliveOnce(ctx, g.ID)
	allowed(t, "keep a Direct grant alive", err)
	_, err = a.Put(ctx, etcdkeys.LeaseKey(prefix, "a", "directx"), "{}")
	denied(t, "write a key that only starts with the Direct Lease's name", err)

	if err := identity.EnsureNamespace(ctx, mgr, prefix, "a", uidOf("a"), nil); err != nil {
		t.Fatal(err)
	}
	a = etcd.Client(t, "a") // etcd checks permissions per request; a new client rules out caching
	_, err = a.KeepAliveOnce(ctx, g.ID)
	denied(t, "keep a grant alive after the Lease left Direct", err)
}

func TestRemovedNamespaceIdentityOpensNothing(t *testing.T) {
	_, mgr, a, _, _ := isolated(t)
	ctx := context.Background()
	if err := identity.RemoveNamespace(ctx, mgr, prefix, "a"); err != nil {
		t.Fatal(err)
	}
	if err := identity.RemoveNamespace(ctx, mgr, prefix, "a"); err != nil {
		t.Fatalf("RemoveNamespace of an absent namespace: %v", err)
	}
	_, err := a.Get(ctx, etcdkeys.LeaseKey(prefix, "a", "l"))
	if err == nil {
		t.Fatal("a removed namespace's certificate still reads its lease key")
	}
}

// etcd cannot revoke a certificate, so a namespace's user names its UID: a
// certificate of a namespace since deleted (valid for up to 90 days, perhaps
// leaked) opens nothing of a new namespace of the same name, nor does one
// of a user an earlier release named like the role, once the identity was
// removed. That earlier user keeps working until then, through an upgrade.
func TestAnIdentityOfANamespaceGoneOpensNothingOfItsSuccessor(t *testing.T) {
	etcd, mgr, a, _, _ := isolated(t)
	ctx := context.Background()
	key := etcdkeys.DataPrefix(prefix, "a") + "x"
	_, err := a.Put(ctx, key, "1")
	allowed(t, "namespace a's certificate writes its data key", err)

	legacy := earlierReleasesUser(t, etcd, mgr, "a")
	if err := identity.EnsureNamespace(ctx, mgr, prefix, "a", uidOf("a"), nil); err != nil {
		t.Fatal(err)
	}
	_, err = etcd.Client(t, "legacy").Get(ctx, key)
	allowed(t, "the earlier release's certificate, before the identity is removed", err)

	// The namespace is deleted (its identity removed) and created again:
	// a new object, a new UID.
	if err := identity.RemoveNamespace(ctx, mgr, prefix, "a"); err != nil {
		t.Fatal(err)
	}
	if err := identity.EnsureNamespace(ctx, mgr, prefix, "a", "uid-a-again", nil); err != nil {
		t.Fatal(err)
	}
	if err := etcd.PKI.Issue("a-again", identity.Request{CommonName: identity.NamespaceUser(prefix, "a", "uid-a-again")}); err != nil {
		t.Fatal(err)
	}
	_, err = etcd.Client(t, "a-again").Put(ctx, key, "2")
	allowed(t, "the new namespace's certificate", err)
	for _, old := range []string{"a", "legacy"} {
		if _, err := etcd.Client(t, old).Put(ctx, key, "stale"); err == nil {
			t.Errorf("the %s certificate of the namespace gone writes its successor's data key", old)
		}
	}

	// A user of an earlier namespace object left behind (removed while no
	// manager ran) goes at the next EnsureNamespace.
	if _, err := mgr.UserAddWithOptions(ctx, identity.NamespaceUser(prefix, "a", "uid-left"), "", &clientv3.UserAddOptions{NoPassword: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := mgr.UserGrantRole(ctx, identity.NamespaceUser(prefix, "a", "uid-left"), legacy); err != nil {
		t.Fatal(err)
	}
	if err := identity.EnsureNamespace(ctx, mgr, prefix, "a", "uid-a-again", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := mgr.UserGet(ctx, identity.NamespaceUser(prefix, "a", "uid-left")); !errors.Is(err, rpctypes.ErrUserNotFound) {
		t.Errorf("the user of an earlier namespace object: %v, want it deleted", err)
	}
	namespaces, err := identity.Namespaces(ctx, mgr, prefix)
	if err != nil || len(namespaces) != 2 {
		t.Errorf("Namespaces: %v, %v; want a and b once each", namespaces, err)
	}
}

// A certificate from another CA, even one naming the manager's user, and a
// client without a certificate, do not get past TLS.
func TestForeignCertificatesAreRefused(t *testing.T) {
	etcd, _, _, _, _ := isolated(t)
	forger, err := devcluster.NewEtcdPKI(t.TempDir(), prefix)
	if err != nil {
		t.Fatal(err)
	}
	tc, err := forger.TLS("manager")
	if err != nil {
		t.Fatal(err)
	}
	tc.RootCAs = nil
	tc.InsecureSkipVerify = true // the forger does not even check the server
	for name, cfg := range map[string]clientv3.Config{
		"certificate of another CA": {TLS: tc},
		"no certificate":            {},
	} {
		cfg.Endpoints = []string{etcd.Endpoint}
		cfg.DialTimeout = 2 * time.Second
		cli, err := clientv3.New(cfg)
		if err != nil {
			continue // refused at dial: fine
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		_, err = cli.Get(ctx, etcdkeys.LeaseKey(prefix, "a", "l"))
		cancel()
		cli.Close()
		if err == nil {
			t.Errorf("%s: read a lease key", name)
		}
	}
}

// The peer protocol bypasses etcd auth (it renews leases and carries raft
// messages), and the CA that signs the members' certificate also signs every
// namespace identity: only the members' CommonName may connect to it.
func TestNamespaceIdentityCannotSpeakThePeerProtocol(t *testing.T) {
	etcd, _, _, _, _ := isolated(t)
	get := func(name string) error {
		tc, err := etcd.PKI.TLS(name)
		if err != nil {
			t.Fatal(err)
		}
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tc}, Timeout: 5 * time.Second}
		resp, err := hc.Get(etcd.PeerURL + "/version")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %s", resp.Status)
		}
		return nil
	}
	if err := get("server"); err != nil {
		t.Fatalf("a member's certificate on the peer port: %v", err)
	}
	if err := get("a"); err == nil {
		t.Fatal("namespace a's certificate was accepted on the peer port")
	}
}

func uidOf(ns string) types.UID { return types.UID("uid-" + ns) }

// The earlier release's user goes as soon as a user of another namespace
// object is found: the name was taken by another object since the upgrade,
// so that user's certificates may be a deleted namespace's, even when no
// manager saw the namespace without fencer objects (RemoveNamespace).
func TestTheEarlierUserGoesWhenTheNamespaceWasCreatedAgain(t *testing.T) {
	etcd, mgr, _, _, _ := isolated(t)
	ctx := context.Background()
	earlierReleasesUser(t, etcd, mgr, "a")
	if err := identity.EnsureNamespace(ctx, mgr, prefix, "a", uidOf("a"), nil); err != nil { // the upgrade
		t.Fatal(err)
	}
	key := etcdkeys.DataPrefix(prefix, "a") + "k"
	_, err := etcd.Client(t, "legacy").Put(ctx, key, "1")
	allowed(t, "the earlier release's certificate after the upgrade", err)
	if err := identity.EnsureNamespace(ctx, mgr, prefix, "a", "uid-a-again", nil); err != nil { // created again, unseen
		t.Fatal(err)
	}
	for _, old := range []string{"legacy", "a"} {
		if _, err := etcd.Client(t, old).Put(ctx, key, "stale"); err == nil {
			t.Errorf("the %s certificate writes the data key of the namespace created again", old)
		}
	}
}

// earlierReleasesUser makes namespace ns's user as releases before the UID
// was part of its name did (named like the role, holding it), and issues
// its certificate as "legacy".
func earlierReleasesUser(t *testing.T, etcd *testenv.SecureEtcd, mgr *clientv3.Client, ns string) string {
	t.Helper()
	ctx := context.Background()
	legacy := identity.NamespaceRole(prefix, ns)
	if _, err := mgr.UserAddWithOptions(ctx, legacy, "", &clientv3.UserAddOptions{NoPassword: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := mgr.UserGrantRole(ctx, legacy, legacy); err != nil {
		t.Fatal(err)
	}
	if err := etcd.PKI.Issue("legacy", identity.Request{CommonName: legacy}); err != nil {
		t.Fatal(err)
	}
	return legacy
}
