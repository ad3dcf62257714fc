package main

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap/zapcore"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/tools/leaderelection"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/fencer-io/fencer/controllers"
	"github.com/fencer-io/fencer/internal/etcdstore"
	"github.com/fencer-io/fencer/internal/identity"
	"github.com/fencer-io/fencer/internal/webhook"
)

// options are the manager's flags; docs/operations.md lists each of them.
type options struct {
	metricsAddr         string
	metricsSecure       bool
	metricsCertDir      string
	probeAddr           string
	leaderElect         bool
	leaderElectionNS    string
	leaseDuration       time.Duration
	renewDeadline       time.Duration
	retryPeriod         time.Duration
	etcd                etcdstore.Config
	etcdProbeTimeout    time.Duration
	zap                 zap.Options
	gracefulShutdown    time.Duration
	leaderElectionIDStr string
	kubeconfig          string
	electionTTL         time.Duration
	webhookPort         int
	webhookHost         string
	webhookCertDir      string
	certRotation        bool
	webhookNamespace    string
	webhookSecret       string
	webhookService      string
	webhookConfigName   string
	webhookClientCA     string
	webhookClientNames  string
	// clientAuth is read from webhookClientCA by validate.
	clientAuth          *webhook.ClientAuth
	kubeAPIQPS          float64
	kubeAPIBurst        int
	leaseWorkers        int
	finalizerNamespaces string
	leaseDeleteWebhook  bool
	pprofAddr           string
	exemptUsers         string
	exemptGroups        string
	etcdAccess          etcdAccess
	namespaces          string
	etcdStepDown        time.Duration
	maintenanceEvery    time.Duration
	defragFree          int64
}

// etcdAccess are the flags that lock etcd down (docs/install.md).
type etcdAccess struct {
	// certFile mirrors --etcd-cert-file, which the auth checks need.
	certFile          string
	pkiSecret         string
	pkiCreate         bool
	serverSecret      string
	serverNames       string
	enableAuth        bool
	credentialsSecret string
	backupSecret      string
	viewerSecret      string
	workloadEndpoints string
	// identityNamespaces get an identity without a Lease or an IDRange.
	identityNamespaces string
	revisionConfigMap  string
}

func (a *etcdAccess) bindFlags(fs *flag.FlagSet) {
	fs.StringVar(&a.pkiSecret, "etcd-pki-secret", "", "Secret (ca.crt, ca.key), in --webhook-namespace, of the CA etcd trusts for client certificates; created if missing. With it the manager authenticates to etcd as <prefix>:manager with a certificate it issues itself (unless --etcd-cert-file is given), and gives every namespace with fencer objects an etcd identity of its own.")
	fs.BoolVar(&a.pkiCreate, "etcd-pki-create", true, "Create --etcd-pki-secret if it is missing. Off when cert-manager issues the CA: the manager then waits for it.")
	fs.StringVar(&a.serverSecret, "etcd-server-secret", "", "Secret, in --webhook-namespace, to keep the bundled etcd members' serving certificate in (issued from --etcd-pki-secret for --etcd-server-names, renewed before expiry).")
	fs.StringVar(&a.serverNames, "etcd-server-names", "", "Comma-separated DNS names and IP addresses of the etcd server certificate, e.g. *.fencer-etcd.fencer-system.svc.")
	fs.StringVar(&a.backupSecret, "etcd-backup-secret", "", "Secret, in --webhook-namespace, to keep the snapshot job's etcd client certificate in (user <prefix>:backup, root role), issued from --etcd-pki-secret.")
	fs.BoolVar(&a.enableAuth, "etcd-enable-auth", false, "Turn etcd authentication on (root role for the manager's user) and stay unready until it is. Needs --etcd-pki-secret or a --etcd-cert-file whose CommonName is <prefix>:manager.")
	fs.StringVar(&a.credentialsSecret, "etcd-credentials-secret", "fencer-etcd-client", "Name of the Secret with a namespace's etcd credentials (ca.crt, tls.crt, tls.key, endpoints, prefix), kept in every namespace that has a Lease or an IDRange, with --etcd-pki-secret.")
	fs.StringVar(&a.viewerSecret, "etcd-viewer-secret", "", "Secret, in --webhook-namespace, to keep the read-only lock viewer's etcd client certificate in (user <prefix>:viewer: reads the keyed locks, writes nothing), with the endpoints and prefix; kubectl fencer locks connects with it. Needs --etcd-pki-secret and --etcd-enable-auth.")
	fs.StringVar(&a.identityNamespaces, "identity-namespaces", "", "Comma-separated namespaces that get an etcd identity even with no Lease or IDRange, for workloads that use only keyed locks (or a fenced data key).")
	fs.StringVar(&a.revisionConfigMap, "etcd-revision-configmap", "fencer-etcd-revision", "ConfigMap, in --webhook-namespace, where the leader records etcd's revision every 10 s; a revision below it later (etcd restored from an old snapshot without --bump-revision) closes keyed locks and Lease grants until etcd passes it. Empty turns the check off, and deletes a floor an earlier check left. Without --webhook-namespace (outside a pod) there is nowhere to record: a leftover floor stays until etcd's revision passes it.")
	fs.StringVar(&a.workloadEndpoints, "etcd-workload-endpoints", "", "Comma-separated etcd client URLs written into the namespaces' credentials; defaults to --etcd-endpoints.")
}

// checkManagerCN refuses to turn auth on with a client certificate that is
// not the manager's user: etcd would lock the manager (and everyone) out.
func checkManagerCN(certFile, prefix string) error {
	if certFile == "" {
		return nil // the self-issued identity is the manager's by construction
	}
	raw, err := os.ReadFile(certFile)
	if err != nil {
		return err
	}
	block, _ := pem.Decode(raw)
	if block == nil {
		return fmt.Errorf("--etcd-cert-file %s holds no PEM certificate", certFile)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return fmt.Errorf("--etcd-cert-file %s: %w", certFile, err)
	}
	if want := identity.ManagerUser(prefix); cert.Subject.CommonName != want {
		return fmt.Errorf("--etcd-enable-auth: the client certificate's CommonName is %q, but etcd would map only %q to the root role, locking the manager out; issue it for %q or leave auth to the etcd's operator", cert.Subject.CommonName, want, want)
	}
	return nil
}

func (a *etcdAccess) validate() error {
	if a.enableAuth && a.pkiSecret == "" && a.certFile == "" {
		return errors.New("--etcd-enable-auth needs an identity with the root role: --etcd-pki-secret, or --etcd-cert-file with the CommonName <prefix>:manager")
	}
	if a.serverSecret != "" && (a.pkiSecret == "" || a.serverNames == "") {
		return errors.New("--etcd-server-secret needs --etcd-pki-secret (the CA to issue from) and --etcd-server-names")
	}
	if a.backupSecret != "" && a.pkiSecret == "" {
		return errors.New("--etcd-backup-secret needs --etcd-pki-secret (the CA to issue from)")
	}
	if a.viewerSecret != "" && (a.pkiSecret == "" || !a.enableAuth) {
		return errors.New("--etcd-viewer-secret needs --etcd-pki-secret (the CA to issue from) and --etcd-enable-auth (without auth its certificate would open all of etcd)")
	}
	if err := namespaceList("identity-namespaces", a.identityNamespaces); err != nil {
		return err
	}
	for _, e := range etcdstore.SplitList(a.workloadEndpoints) {
		if err := etcdstore.CheckEndpoint(e); err != nil {
			return fmt.Errorf("--etcd-workload-endpoints (the URLs the workloads' etcd clients dial): %w", err)
		}
	}
	if a.pkiSecret != "" {
		// The workloads' credentials are certificates: their clients use TLS.
		if err := etcdstore.CheckTLSEndpoints(etcdstore.SplitList(a.workloadEndpoints)); err != nil {
			return fmt.Errorf("--etcd-workload-endpoints (the workloads' clients use TLS with --etcd-pki-secret): %w", err)
		}
	}
	if a.credentialsSecret == "" {
		return errors.New("--etcd-credentials-secret must not be empty")
	}
	return nil
}

// maxVerbosity is the highest numeric --zap-log-level: zap keeps a level
// in an int8, and controller-runtime sets verbosity n as level -n, so 129
// and above wrap around to levels past Error, and the manager would log
// nothing at all.
const maxVerbosity = 128

// boundedLevel is controller-runtime's --zap-log-level, refusing a number
// above maxVerbosity.
type boundedLevel struct{ flag.Value }

// String is the level given, "" for the zero value flag.PrintDefaults
// makes to find a flag's default.
func (b boundedLevel) String() string {
	if b.Value == nil {
		return ""
	}
	return b.Value.String()
}

func (b boundedLevel) Set(v string) error {
	if n, err := strconv.Atoi(v); err == nil && n > maxVerbosity {
		return fmt.Errorf("verbosity %d is above %d, the most zap keeps (a larger number wraps around to a level that drops even errors): give 1 to %d, or debug, info, error or panic", n, maxVerbosity, maxVerbosity)
	}
	return b.Value.Set(v)
}

// objectNames refuses a flag naming one Kubernetes object (a Secret, a
// ConfigMap, a Lease, a namespace) with a name no such object can have:
// accepted, it would fail only at run time, on every write to it, or
// quietly switch a check off (the revision ConfigMap's).
func (o *options) objectNames() error {
	a := &o.etcdAccess
	for _, n := range []struct {
		flag, value string
		check       func(string) []string
	}{
		{"etcd-pki-secret", a.pkiSecret, validation.IsDNS1123Subdomain},
		{"etcd-server-secret", a.serverSecret, validation.IsDNS1123Subdomain},
		{"etcd-backup-secret", a.backupSecret, validation.IsDNS1123Subdomain},
		{"etcd-viewer-secret", a.viewerSecret, validation.IsDNS1123Subdomain},
		{"etcd-credentials-secret", a.credentialsSecret, validation.IsDNS1123Subdomain},
		{"etcd-revision-configmap", a.revisionConfigMap, validation.IsDNS1123Subdomain},
		{"leader-election-id", o.leaderElectionIDStr, validation.IsDNS1123Subdomain},
		{"leader-election-namespace", o.leaderElectionNS, validation.IsDNS1123Label},
		{"webhook-namespace", o.webhookNamespace, validation.IsDNS1123Label},
		{"webhook-secret", o.webhookSecret, validation.IsDNS1123Subdomain},
		{"webhook-config-name", o.webhookConfigName, validation.IsDNS1123Subdomain},
		{"webhook-service", o.webhookService, validation.IsDNS1035Label},
	} {
		if n.value == "" {
			continue // unset, or turned off; the checks above say when it is needed
		}
		if errs := n.check(n.value); len(errs) > 0 {
			return fmt.Errorf("--%s: %q cannot name the object: %s", n.flag, n.value, strings.Join(errs, "; "))
		}
	}
	return nil
}

// namespaceList refuses a comma-separated list of flag that names
// something no namespace can be called.
func namespaceList(flag, list string) error {
	for _, ns := range etcdstore.SplitList(list) {
		if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
			return fmt.Errorf("--%s: %q is not a namespace name: %s", flag, ns, strings.Join(errs, "; "))
		}
	}
	return nil
}

func (o *options) validate() error {
	if err := o.etcd.Validate(); err != nil {
		return err
	}
	o.etcdAccess.certFile = o.etcd.CertFile
	if err := o.etcdAccess.validate(); err != nil {
		return err
	}
	if o.etcdAccess.pkiSecret != "" {
		// The manager's own identity is issued from the CA: a client
		// certificate, sent only over TLS.
		if err := etcdstore.CheckTLSEndpoints(o.etcd.Endpoints); err != nil {
			return fmt.Errorf("--etcd-endpoints (the manager uses TLS with --etcd-pki-secret): %w", err)
		}
	}
	if (o.etcdAccess.pkiSecret != "" || o.etcdAccess.serverSecret != "") && o.webhookNamespace == "" {
		return errors.New("--etcd-pki-secret needs --webhook-namespace (not running in a pod, so it cannot be guessed)")
	}
	if o.leaderElect && o.renewDeadline >= o.leaseDuration {
		return fmt.Errorf("--leader-elect-renew-deadline (%s) must be less than --leader-elect-lease-duration (%s)", o.renewDeadline, o.leaseDuration)
	}
	if o.leaderElect && (o.retryPeriod <= 0 || float64(o.renewDeadline) <= leaderelection.JitterFactor*float64(o.retryPeriod)) {
		// client-go's own rule, checked here to name the flags.
		return fmt.Errorf("--leader-elect-retry-period (%s) must be positive, and --leader-elect-renew-deadline (%s) more than %g times it",
			o.retryPeriod, o.renewDeadline, leaderelection.JitterFactor)
	}
	if o.electionTTL < time.Second {
		return fmt.Errorf("--etcd-election-ttl must be at least 1s, got %s", o.electionTTL)
	}
	if o.electionTTL%time.Second != 0 {
		// etcd grants leases in whole seconds: 1500ms would run as 1s.
		return fmt.Errorf("--etcd-election-ttl must be whole seconds (etcd leases are), got %s", o.electionTTL)
	}
	if o.webhookPort < 0 || o.webhookPort > 65535 {
		return fmt.Errorf("--webhook-port must be between 0 and 65535, got %d", o.webhookPort)
	}
	if o.certRotation && o.webhookPort == 0 {
		return errors.New("--webhook-cert-rotation needs the webhook server; --webhook-port is 0")
	}
	if o.certRotation && o.webhookNamespace == "" {
		return errors.New("--webhook-cert-rotation needs --webhook-namespace (not running in a pod, so it cannot be guessed)")
	}
	if !(o.kubeAPIQPS > 0) || math.IsInf(o.kubeAPIQPS, 1) || o.kubeAPIBurst <= 0 { // !(> 0) refuses NaN too
		return fmt.Errorf("--kube-api-qps and --kube-api-burst must be positive, got %g and %d", o.kubeAPIQPS, o.kubeAPIBurst)
	}
	if o.leaseWorkers < 1 {
		return fmt.Errorf("--lease-workers must be at least 1, got %d", o.leaseWorkers)
	}
	if o.leaseDeleteWebhook && o.webhookPort == 0 {
		return errors.New("--lease-delete-webhook needs the webhook server; --webhook-port is 0")
	}
	if err := o.loadClientAuth(); err != nil {
		return err
	}
	if err := o.objectNames(); err != nil {
		return err
	}
	for flag, list := range map[string]string{"namespaces": o.namespaces, "lease-finalizer-namespaces": o.finalizerNamespaces} {
		if err := namespaceList(flag, list); err != nil {
			return err
		}
	}
	if o.etcdStepDown < 0 || o.maintenanceEvery < 0 || o.defragFree < 0 {
		return errors.New("--etcd-step-down-after, --etcd-maintenance-interval and --etcd-defrag-free-bytes must not be negative")
	}
	if o.etcdProbeTimeout <= 0 {
		return fmt.Errorf("--etcd-probe-timeout must be positive, got %s", o.etcdProbeTimeout)
	}
	if err := o.checkPorts(); err != nil {
		return err
	}
	return checkExemptGroups(o.exemptGroups)
}

// checkPorts refuses two of the manager's servers on one address: the
// second could not listen, and the manager would stop at start-up with a
// bind error that names neither flag. An empty host is every interface,
// so it meets any host on the same port.
func (o *options) checkPorts() error {
	addrs := []struct{ flag, addr string }{
		{"--metrics-bind-address", o.metricsAddr},
		{"--health-probe-bind-address", o.probeAddr},
		{"--pprof-bind-address", o.pprofAddr},
	}
	if o.webhookPort != 0 {
		addrs = append(addrs, struct{ flag, addr string }{"--webhook-port", net.JoinHostPort(o.webhookHost, strconv.Itoa(o.webhookPort))})
	}
	type bound struct{ flag, host, port string }
	var seen []bound
	for _, a := range addrs {
		host, port, err := net.SplitHostPort(a.addr)
		if a.addr == "0" || err != nil || port == "0" {
			continue // off, or left to the server to report
		}
		for _, b := range seen {
			if b.port == port && (b.host == "" || host == "" || b.host == host) {
				return fmt.Errorf("%s and %s both listen on port %s: give each server a port of its own", b.flag, a.flag, port)
			}
		}
		seen = append(seen, bound{a.flag, host, port})
	}
	return nil
}

// checkExemptGroups refuses a group that holds every workload: its
// members' writes would pass without a token, and the fence would hold
// against almost no one.
func checkExemptGroups(list string) error {
	for _, g := range etcdstore.SplitList(list) {
		switch g {
		case "system:authenticated", "system:unauthenticated", "system:serviceaccounts":
			return fmt.Errorf("--exempt-groups names %s: every write by its members (a workload's service account among them) would pass without a token; exempt the lifecycle controllers by name with --exempt-users, or the group system:serviceaccounts:kube-system", g)
		}
	}
	return nil
}

// loadClientAuth reads --webhook-client-ca-file, so a missing or empty
// file stops the manager at start rather than at the first review.
func (o *options) loadClientAuth() error {
	names := etcdstore.SplitList(o.webhookClientNames)
	if o.webhookClientCA == "" {
		if len(names) > 0 {
			return errors.New("--webhook-client-names needs --webhook-client-ca-file: without a CA no client certificate is read")
		}
		return nil
	}
	if o.webhookPort == 0 {
		return errors.New("--webhook-client-ca-file needs the webhook server; --webhook-port is 0")
	}
	auth, err := webhook.LoadClientAuth(o.webhookClientCA, names)
	if err != nil {
		return err
	}
	o.clientAuth = auth
	return nil
}

func parseFlags(args []string) (*options, error) { return parseFlagsTo(args, os.Stderr) }

// parseFlagsTo parses args, writing usage and parse errors to out.
func parseFlagsTo(args []string, out io.Writer) (*options, error) {
	o := &options{}
	fs := o.flagSet()
	fs.SetOutput(out)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q: fencer takes only flags", fs.Args())
	}
	if err := o.validate(); err != nil {
		return nil, err
	}
	return o, nil
}

func (o *options) flagSet() *flag.FlagSet {
	fs := flag.NewFlagSet("fencer", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "fencer: the fencer manager (Lease and IDRange controllers, admission webhook).\n\nUsage: fencer --etcd-endpoints=URL[,URL...] [flags]\n\nFlags:\n")
		fs.PrintDefaults()
	}
	fs.StringVar(&o.metricsAddr, "metrics-bind-address", ":8443", "Address the Prometheus metrics endpoint (/metrics) listens on; \"0\" disables it.")
	fs.BoolVar(&o.metricsSecure, "metrics-secure", true, "Serve metrics over HTTPS to scrapers with a bearer token whose user may get the non-resource URL /metrics (checked with TokenReview and SubjectAccessReview). False serves plain HTTP to anyone who can connect.")
	fs.StringVar(&o.metricsCertDir, "metrics-cert-dir", "", "Directory holding the metrics endpoint's tls.crt and tls.key, reloaded when they change; empty (or no files there) serves a self-signed certificate.")
	fs.StringVar(&o.probeAddr, "health-probe-bind-address", ":8081", "Address the /healthz and /readyz probes listen on.")
	fs.BoolVar(&o.leaderElect, "leader-elect", true, "Elect one active controller among the replicas. Turn off only when running a single replica.")
	fs.StringVar(&o.leaderElectionNS, "leader-election-namespace", "", "Namespace of the leader-election Lease; defaults to the pod's namespace.")
	fs.StringVar(&o.leaderElectionIDStr, "leader-election-id", "fencer.fencer.io", "Name of the leader-election Lease.")
	fs.DurationVar(&o.leaseDuration, "leader-elect-lease-duration", 4*time.Second, "How long a standby waits after the last renewal before taking over. Bounds controller failover; keep it well under the smallest Lease ttlSeconds.")
	fs.DurationVar(&o.renewDeadline, "leader-elect-renew-deadline", 3*time.Second, "How long the leader keeps trying to renew before it steps down. Must be less than --leader-elect-lease-duration.")
	fs.DurationVar(&o.retryPeriod, "leader-elect-retry-period", 500*time.Millisecond, "How often candidates try to acquire or renew leadership.")
	fs.DurationVar(&o.etcdProbeTimeout, "etcd-probe-timeout", 2*time.Second, "Timeout of the etcd read behind /readyz and the leader's etcd watchdog.")
	fs.DurationVar(&o.etcdStepDown, "etcd-step-down-after", 5*time.Second, "How long the leader may fail to reach etcd before it gives up leadership (and exits, to be restarted), so a replica that reaches etcd takes over. 0 disables; so does --leader-elect=false, as there is no standby.")
	fs.DurationVar(&o.maintenanceEvery, "etcd-maintenance-interval", 5*time.Minute, "How often the leader maintains etcd: clears a NOSPACE alarm, compacts the revisions older than one interval, and defragments members with much free space. 0 disables, for an etcd maintained by other means.")
	fs.Int64Var(&o.defragFree, "etcd-defrag-free-bytes", 64<<20, "Free backend space above which a member is defragmented (if it is also half the backend). One member at a time.")
	fs.DurationVar(&o.gracefulShutdown, "graceful-shutdown-timeout", 10*time.Second, "How long the manager waits for controllers to stop on SIGTERM.")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "Path of a kubeconfig, for running outside a cluster. Default: $KUBECONFIG, then the in-cluster service account, then ~/.kube/config.")
	fs.DurationVar(&o.electionTTL, "etcd-election-ttl", 2*time.Second, "Session TTL of the controller's etcd election (whole seconds). A crashed leader's grants are fenced off this long after its last keepalive.")
	o.etcd.BindFlags(fs)
	o.etcdAccess.bindFlags(fs)
	fs.IntVar(&o.webhookPort, "webhook-port", 9443, "Port the admission webhook serves HTTPS on; 0 disables the webhook server.")
	fs.StringVar(&o.webhookHost, "webhook-host", "", "Address the admission webhook listens on; empty means all interfaces.")
	fs.StringVar(&o.webhookCertDir, "webhook-cert-dir", "/tmp/k8s-webhook-server/serving-certs", "Directory holding the webhook's serving certificate, tls.crt and tls.key. The server reloads them when they change; /readyz fails until they are served.")
	fs.BoolVar(&o.certRotation, "webhook-cert-rotation", false, "Manage the webhook's certificate: create a CA and serving certificate in --webhook-secret, rotate them, write them to --webhook-cert-dir and inject the CA into the --webhook-config-name Mutating- and ValidatingWebhookConfigurations. Leave off when cert-manager or another tool provides the certificate.")
	fs.StringVar(&o.webhookNamespace, "webhook-namespace", podNamespace(), "Namespace of the webhook Service and certificate Secret; defaults to the pod's namespace.")
	fs.StringVar(&o.webhookSecret, "webhook-secret", "fencer-webhook-cert", "Secret holding the webhook's CA and serving certificate, with --webhook-cert-rotation.")
	fs.StringVar(&o.webhookConfigName, "webhook-config-name", webhook.DefaultConfigName, "Name of this install's Mutating- and ValidatingWebhookConfiguration, into which --webhook-cert-rotation injects the CA. Each install in a cluster has its own.")
	fs.StringVar(&o.webhookService, "webhook-service", "fencer-webhook", "Service in front of the webhook; the certificate is issued for <service>.<namespace>.svc.")
	fs.StringVar(&o.exemptUsers, "exempt-users", strings.Join(webhook.DefaultExemptUsers, ","), "Comma-separated usernames whose writes to fenced objects pass without a token: the lifecycle controllers (namespace deletion, garbage collection). Every other write that cannot carry a token (DELETE, /status, /scale) is refused unless it comes from a bindIdentity Lease's holder pod.")
	fs.StringVar(&o.webhookClientCA, "webhook-client-ca-file", "", "PEM file of the CA that signs the apiserver's client certificate for webhooks (its --admission-control-config-file gives it one). When set, every webhook path answers 403 to a caller without a certificate from this CA, so a pod that reaches the port cannot post a forged review. Read at start.")
	fs.StringVar(&o.webhookClientNames, "webhook-client-names", "", "Comma-separated common names or DNS names the webhook's client certificate must carry, for a CA that also signs other clients' certificates; empty accepts any certificate from --webhook-client-ca-file.")
	fs.StringVar(&o.exemptGroups, "exempt-groups", "", "Comma-separated groups whose members are exempt like --exempt-users.")
	fs.Float64Var(&o.kubeAPIQPS, "kube-api-qps", 50, "Sustained requests per second the manager may send the Kubernetes API (client-side limit). A first grant costs two writes (pod annotation, status; a third, the finalizer, where the webhook lease-finalizer.fencer.io did not set it at create), so this bounds how fast many Leases are granted at once.")
	fs.IntVar(&o.kubeAPIBurst, "kube-api-burst", 100, "Requests the manager may send the Kubernetes API in a burst above --kube-api-qps.")
	fs.StringVar(&o.pprofAddr, "pprof-bind-address", "0", "Address of Go's pprof endpoints (/debug/pprof/); \"0\" disables them. For profiling, never expose it outside the pod.")
	fs.StringVar(&o.namespaces, "namespaces", "", "Comma-separated namespaces whose Leases, IDRanges and WorkloadLeases this install serves; empty serves all. Give each install sharing a cluster its own namespaces (and its webhook configurations the same list).")
	fs.BoolVar(&o.leaseDeleteWebhook, "lease-delete-webhook", false, "Serve the Lease deletion webhook (lease-delete.fencer.io), which releases a Lease's grant as the apiserver admits the Lease's DELETE, and put the finalizer fencer.io/release only on Leases in --lease-finalizer-namespaces: a Lease's deletion then needs no write from the manager and does not wait for it. Enable it only where nothing but the apiserver can reach the webhook port, or with --webhook-client-ca-file (docs/install.md): otherwise the webhook cannot tell a forged review from the apiserver's.")
	fs.StringVar(&o.finalizerNamespaces, "lease-finalizer-namespaces", "kube-system", "With --lease-delete-webhook: comma-separated namespaces whose Leases still get the finalizer fencer.io/release, those the Lease deletion webhook skips. Give it the webhook configuration's excluded namespaces (the chart passes webhook.excludeNamespaces). Without --lease-delete-webhook every Lease gets the finalizer.")
	fs.IntVar(&o.leaseWorkers, "lease-workers", controllers.DefaultLeaseWorkers, "Leases reconciled in parallel. Each Lease is reconciled by one worker at a time; they bound how many simultaneous failovers proceed at once.")
	// Millisecond timestamps: failovers are measured in them.
	o.zap.TimeEncoder = zapcore.RFC3339NanoTimeEncoder
	o.zap.BindFlags(fs)
	if f := fs.Lookup("zap-log-level"); f != nil {
		f.Value = boundedLevel{f.Value}
		f.Usage = "Zap level to configure the verbosity of logging: 'debug', 'info', 'error', 'panic' or a verbosity from 1 to 128 (more with each step; zap keeps no more)."
	}
	if f := fs.Lookup("zap-time-encoding"); f != nil { // zap's help names its own default
		f.Usage = strings.Replace(f.Usage, "Defaults to 'epoch'.", "Defaults to 'rfc3339nano' (fencer's).", 1)
	}
	return fs
}
