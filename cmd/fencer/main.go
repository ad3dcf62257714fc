// Command fencer is the fencer manager: the Lease and IDRange controllers, the
// admission webhook, metrics and health probes, in one process.
package main

import (
	"context"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/uuid"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	fencerv1alpha1 "github.com/fencer-io/fencer/api/v1alpha1"
	"github.com/fencer-io/fencer/controllers"
	"github.com/fencer-io/fencer/internal/etcdstore"
	"github.com/fencer-io/fencer/internal/identity"
	"github.com/fencer-io/fencer/internal/metrics"
	"github.com/fencer-io/fencer/internal/webhook"
)

func newScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(fencerv1alpha1.AddToScheme(s))
	return s
}

// version is fencer's version, reported as fencer_build_info; release
// builds set it with -ldflags "-X main.version=…".
var version = "0.1.0"

func main() {
	if ran, code := subcommand(os.Args[1:]); ran {
		os.Exit(code)
	}
	o, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "fencer: %v\n", err)
		os.Exit(2)
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&o.zap)))
	if err := run(ctrl.SetupSignalHandler(), o); err != nil {
		ctrl.Log.Error(err, "fencer stopped")
		os.Exit(1)
	}
}

func run(ctx context.Context, o *options) error {
	log := ctrl.Log.WithName("setup")
	if err := o.etcd.CheckTLS(); err != nil {
		return err
	}
	cfg, err := restConfig(o.kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	ca, err := loadEtcdCA(ctx, cfg, o)
	if err != nil {
		return err
	}
	etcdCfg := o.etcd
	if ca != nil && etcdCfg.CertFile == "" {
		etcdCfg.TLS = identity.SelfIssued(ca, identity.ManagerUser(o.etcd.Prefix))
	}
	etcd, err := etcdstore.Connect(etcdCfg)
	if err != nil {
		return err
	}
	defer etcd.Close()
	// A leader over the endpoints of two etcd clusters would grant in both.
	if err := etcdstore.OneCluster(ctx, etcd, o.etcd.RequestTimeout); err != nil {
		return err
	}

	cfg.QPS, cfg.Burst = float32(o.kubeAPIQPS), o.kubeAPIBurst
	cacheOpts := controllers.CacheOptions(etcdstore.SplitList(o.namespaces))
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                        newScheme(),
		Metrics:                       metrics.ServerOptions(o.metricsAddr, o.metricsSecure, o.metricsCertDir),
		HealthProbeBindAddress:        o.probeAddr,
		PprofBindAddress:              o.pprofAddr,
		Cache:                         cacheOpts,
		LeaderElection:                o.leaderElect,
		LeaderElectionID:              o.leaderElectionIDStr,
		LeaderElectionNamespace:       o.leaderElectionNS,
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 &o.leaseDuration,
		RenewDeadline:                 &o.renewDeadline,
		RetryPeriod:                   &o.retryPeriod,
		GracefulShutdownTimeout:       &o.gracefulShutdown,
		WebhookServer:                 webhookServer(o),
	})
	if err != nil {
		return fmt.Errorf("creating manager: %w", err)
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("etcd", etcdReadyCheck(etcd, o.etcd.Prefix, o.etcdProbeTimeout)); err != nil {
		return err
	}
	if o.webhookPort != 0 {
		// Ready only once the webhook serves TLS with its certificate: with
		// failurePolicy Fail, an endpoint that cannot answer refuses writes.
		if err := mgr.AddReadyzCheck("webhook", mgr.GetWebhookServer().StartedChecker()); err != nil {
			return err
		}
	}
	if err := setupEtcdAccess(mgr, etcd, ca, o); err != nil {
		return err
	}
	if err := setupControllers(mgr, etcd, ca, o); err != nil {
		return err
	}
	log.Info("starting manager", "etcdEndpoints", o.etcd.Endpoints, "etcdPrefix", o.etcd.Prefix, "leaderElect", o.leaderElect)
	return mgr.Start(ctx)
}

// setupControllers builds the etcd election and the store it fences, and
// hands them to the reconcilers and the webhook.
func setupControllers(mgr ctrl.Manager, etcd *clientv3.Client, ca *identity.CA, o *options) error {
	host, _ := os.Hostname()
	elector := etcdstore.NewElector(etcd, o.etcd.Prefix, fmt.Sprintf("%s_%s", host, uuid.NewUUID()), o.electionTTL)
	elector.Log = ctrl.Log.WithName("elector")
	if err := mgr.Add(elector); err != nil {
		return err
	}
	store := etcdstore.NewStore(etcd, o.etcd.Prefix, elector, metrics.ObserveEtcd)
	store.Timeout = o.etcd.RequestTimeout
	store.Log = ctrl.Log.WithName("etcd")
	copts := controllers.Options{LeaseWorkers: o.leaseWorkers,
		LeaseDeleteWebhook:       o.leaseDeleteWebhook,
		LeaseFinalizerNamespaces: etcdstore.SplitList(o.finalizerNamespaces)}
	if ca != nil {
		copts.Identity = &controllers.IdentityReconciler{Etcd: etcd, CA: ca, Prefix: o.etcd.Prefix, Endpoints: workloadEndpoints(o), SecretName: o.etcdAccess.credentialsSecret,
			Always: etcdstore.SplitList(o.etcdAccess.identityNamespaces)}
	}
	if err := controllers.Setup(mgr, store, elector, copts); err != nil {
		return err
	}
	ctrlmetrics.Registry.MustRegister(&controllers.LeaseStates{Reader: mgr.GetCache(), Clock: clock.RealClock{}}, &controllers.LockStates{Etcd: etcd, Prefix: o.etcd.Prefix}, certExpiry(ca, o))
	record, keepFloor := revisionRecord(o)
	if keepFloor {
		ctrl.Log.WithName("lock-floor").Info("etcd's revision is not recorded: --etcd-revision-configmap needs --webhook-namespace (not running in a pod); a lock floor an earlier check left stays until etcd's revision passes it",
			"configmap", o.etcdAccess.revisionConfigMap)
	}
	floor := &controllers.LockFloor{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Etcd: etcd, Prefix: o.etcd.Prefix,
		Record: record, KeepFloor: keepFloor, Every: 10 * time.Second, Log: ctrl.Log.WithName("lock-floor")}
	if err := mgr.Add(floor); err != nil {
		return err
	}
	metrics.SetBuildInfo(version)
	go func() {
		// Without leader election Elected is closed at once.
		<-mgr.Elected()
		metrics.Leader.Set(1)
	}()
	if o.webhookPort == 0 {
		return nil
	}
	if o.certRotation {
		err := webhook.AddCertRotation(context.Background(), mgr, webhook.RotationOptions{
			Secret:     types.NamespacedName{Namespace: o.webhookNamespace, Name: o.webhookSecret},
			Service:    o.webhookService,
			CertDir:    o.webhookCertDir,
			ConfigName: o.webhookConfigName,
		})
		if err != nil {
			return err
		}
	}
	exempt := webhook.NewExempt(strings.Split(o.exemptUsers, ","), strings.Split(o.exemptGroups, ","))
	return webhook.Register(context.Background(), mgr, store, webhook.Options{Exempt: exempt, ReleaseAtDelete: o.leaseDeleteWebhook,
		Finalize: controllers.FinalizeIn(etcdstore.SplitList(o.finalizerNamespaces), !o.leaseDeleteWebhook)})
}

// workloadEndpoints are the etcd client URLs workloads (and the lock
// viewer) connect to.
func workloadEndpoints(o *options) []string {
	if o.etcdAccess.workloadEndpoints != "" {
		return etcdstore.SplitList(o.etcdAccess.workloadEndpoints)
	}
	return o.etcd.Endpoints
}

// certExpiry reports the expiry of every certificate this replica serves
// or presents that something other than the manager renews, so an alert can
// fire before it lapses.
func certExpiry(ca *identity.CA, o *options) *metrics.CertExpiry {
	c := &metrics.CertExpiry{Files: map[string]string{}, Loaded: map[string]*x509.Certificate{}}
	if o.webhookPort != 0 {
		c.Files["webhook"] = filepath.Join(o.webhookCertDir, "tls.crt")
	}
	if o.metricsSecure && o.metricsCertDir != "" {
		c.Files["metrics"] = filepath.Join(o.metricsCertDir, "tls.crt")
	}
	if o.etcd.CertFile != "" {
		c.Files["etcd-client"] = o.etcd.CertFile
	}
	if ca != nil {
		c.Loaded["etcd-ca"] = ca.Cert
	}
	return c
}

// loadEtcdCA reads (or creates) the etcd CA of --etcd-pki-secret before the
// manager starts: the manager's own etcd identity is issued from it.
func loadEtcdCA(ctx context.Context, cfg *rest.Config, o *options) (*identity.CA, error) {
	if o.etcdAccess.pkiSecret == "" {
		return nil, nil
	}
	c, err := client.New(cfg, client.Options{Scheme: newScheme()})
	if err != nil {
		return nil, err
	}
	return identity.LoadOrCreateCA(ctx, c, types.NamespacedName{Namespace: o.webhookNamespace, Name: o.etcdAccess.pkiSecret}, o.etcdAccess.pkiCreate)
}

// setupEtcdAccess adds the runnables that keep etcd locked, maintained and
// reachable: the members' server certificate and the backup identity, the
// leader's watchdog and maintenance, and turning auth on.
func setupEtcdAccess(mgr ctrl.Manager, etcd *clientv3.Client, ca *identity.CA, o *options) error {
	a := o.etcdAccess
	root := []string{identity.ManagerUser(o.etcd.Prefix)}
	certs := map[string]identity.Request{}
	extra := map[string]map[string][]byte{}
	if a.serverSecret != "" {
		certs[a.serverSecret] = identity.ServerRequest(etcdstore.SplitList(a.serverNames))
	}
	if a.backupSecret != "" {
		certs[a.backupSecret] = identity.Request{CommonName: identity.BackupUser(o.etcd.Prefix)}
		root = append(root, identity.BackupUser(o.etcd.Prefix))
	}
	if a.viewerSecret != "" {
		certs[a.viewerSecret] = identity.Request{CommonName: identity.ViewerUser(o.etcd.Prefix)}
		extra[a.viewerSecret] = map[string][]byte{"endpoints": []byte(strings.Join(workloadEndpoints(o), ",")), "prefix": []byte(o.etcd.Prefix)}
	}
	for name, req := range certs {
		err := mgr.Add(&identity.CertSecret{
			Client:  mgr.GetClient(),
			Reader:  mgr.GetAPIReader(),
			CA:      ca,
			Key:     types.NamespacedName{Namespace: o.webhookNamespace, Name: name},
			Request: req,
			Extra:   extra[name],
			Log:     ctrl.Log.WithName("etcd-pki"),
		})
		if err != nil {
			return err
		}
	}
	maint := &etcdstore.Maintainer{Cli: etcd, Every: o.maintenanceEvery, DefragFree: o.defragFree, Log: ctrl.Log.WithName("etcd-maintenance")}
	if o.maintenanceEvery > 0 {
		if err := mgr.Add(maint); err != nil {
			return err
		}
	}
	if err := mgr.Add(&etcdstore.ClusterGuard{Cli: etcd, Every: 10 * time.Second, Timeout: o.etcdProbeTimeout}); err != nil {
		return err
	}
	// A single replica (no leader election) has no standby to hand over to.
	if o.etcdStepDown > 0 && o.leaderElect {
		dog := &etcdstore.Watchdog{Cli: etcd, Prefix: o.etcd.Prefix, Interval: time.Second, ProbeTimeout: o.etcdProbeTimeout, Timeout: o.etcdStepDown, Paused: maint.Defragmenting, Log: ctrl.Log.WithName("etcd-watchdog")}
		if err := mgr.Add(dog); err != nil {
			return err
		}
		if err := mgr.AddHealthzCheck("etcd-leader", dog.Checker); err != nil {
			return err
		}
	}
	if !a.enableAuth {
		return nil
	}
	if err := checkManagerCN(a.certFile, o.etcd.Prefix); err != nil {
		return err
	}
	enabler := &identity.AuthEnabler{Etcd: etcd, Root: root, Log: ctrl.Log.WithName("etcd-auth")}
	if a.viewerSecret != "" {
		enabler.ViewerPrefix = o.etcd.Prefix
	}
	if err := mgr.Add(enabler); err != nil {
		return err
	}
	return mgr.AddReadyzCheck("etcd-auth", enabler.Checker)
}

// revisionRecord is where the etcd revision check records, if anywhere.
// --etcd-revision-configmap="" turns the check off, and the LockFloor then
// deletes a floor an earlier check left. A ConfigMap name with no
// namespace to put it in (a manager run outside a pod without
// --webhook-namespace) cannot record either, but nobody asked to drop the
// protection: keepFloor, and a leftover floor stays until etcd's revision
// passes it, as the check itself would have it.
func revisionRecord(o *options) (record types.NamespacedName, keepFloor bool) {
	switch name := o.etcdAccess.revisionConfigMap; {
	case name == "":
		return types.NamespacedName{}, false
	case o.webhookNamespace == "":
		return types.NamespacedName{}, true
	default:
		return types.NamespacedName{Namespace: o.webhookNamespace, Name: name}, false
	}
}

// podNamespace is the namespace of the pod fencer runs in, or "".
func podNamespace() string {
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		return ns
	}
	raw, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(raw))
}

func webhookServer(o *options) ctrlwebhook.Server {
	if o.webhookPort == 0 {
		return nil
	}
	opts := ctrlwebhook.Options{Host: o.webhookHost, Port: o.webhookPort, CertDir: o.webhookCertDir}
	if o.clientAuth != nil {
		opts.TLSOpts = append(opts.TLSOpts, o.clientAuth.TLS)
	}
	return &webhook.CertGatedServer{
		Server:     ctrlwebhook.NewServer(opts),
		CertDir:    o.webhookCertDir,
		ClientAuth: o.clientAuth,
	}
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		return clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	return ctrl.GetConfig()
}

// etcdReadyCheck keeps the replica out of Service endpoints while it cannot
// reach an etcd quorum: it could neither grant nor answer the webhook.
func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func etcdReadyCheck(cli *clientv3.Client, prefix string, timeout time.Duration) healthz.Checker {
	return func(req *http.Request) error {
		ctx, cancel := context.WithTimeout(req.Context(), timeout)
		defer cancel()
		err := etcdstore.Ping(ctx, cli, prefix)
		// The kubelet probes every replica, so standbys report too.
		metrics.EtcdHealthy.Set(boolGauge(err == nil))
		return err
	}
}
