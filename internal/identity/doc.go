// Package identity locks down fencer's etcd: a CA that issues etcd's
// server certificates and every client identity, etcd users and roles that
// map those identities to key ranges, and the per-namespace credentials
// workloads mount.
//
// etcd runs with client-certificate authentication and auth on. A client
// certificate's CommonName is its etcd user. The manager's user holds the
// root role; each namespace that has fencer objects gets a user whose role
// reads that namespace's lease keys and writes its IDRange and data keys,
// and nothing else (NamespacePermissions).
package identity
