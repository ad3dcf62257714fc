package main

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"os"
	"strings"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/log/zap"
)

// The manager's options: defaults, every validation message, and the docs
// that list the flags.

func TestParseFlags(t *testing.T) {
	o, err := parseFlags([]string{"--etcd-endpoints=http://127.0.0.1:2379"})
	if err != nil {
		t.Fatal(err)
	}
	if !o.leaderElect || o.etcd.Prefix != "/fencer" || o.probeAddr != ":8081" {
		t.Fatalf("defaults: %+v", o)
	}
}

// Two servers may share a port on two different addresses.
func TestServersShareAPortOnTwoAddresses(t *testing.T) {
	if _, err := parseFlags([]string{"--etcd-endpoints=http://127.0.0.1:2379", "--metrics-bind-address=127.0.0.1:9000", "--health-probe-bind-address=127.0.0.2:9000"}); err != nil {
		t.Fatal(err)
	}
}

func TestParseFlagsRefusals(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{nil, "--etcd-endpoints is required"},
		{[]string{"--etcd-endpoints=http://e:1", "stray"}, `unexpected arguments ["stray"]`},
		{[]string{"--etcd-endpoints=http://e:1", "--leader-elect-renew-deadline=5s"}, "--leader-elect-renew-deadline (5s) must be less than --leader-elect-lease-duration (4s)"},
		{[]string{"--etcd-endpoints=http://e:1", "--leader-elect-retry-period=3s"}, "--leader-elect-retry-period (3s) must be positive, and --leader-elect-renew-deadline (3s) more than 1.2 times it"},
		{[]string{"--etcd-endpoints=http://e:1", "--leader-elect-retry-period=2600ms"}, "--leader-elect-renew-deadline (3s) more than 1.2 times it"},
		{[]string{"--etcd-endpoints=http://e:1", "--leader-elect-lease-duration=-1s", "--leader-elect-renew-deadline=-2s", "--leader-elect-retry-period=-3s"}, "--leader-elect-retry-period (-3s) must be positive"},
		{[]string{"--etcd-endpoints=http://e:1", "--kube-api-qps=NaN"}, "--kube-api-qps and --kube-api-burst must be positive, got NaN"},
		{[]string{"--etcd-endpoints=http://e:1", "--kube-api-qps=+Inf"}, "--kube-api-qps and --kube-api-burst must be positive, got +Inf"},
		{[]string{"--etcd-endpoints=http://e:1", "--namespaces=team-a,Team_B"}, `--namespaces: "Team_B" is not a namespace name`},
		{[]string{"--etcd-endpoints=http://e:1", "--etcd-workload-endpoints=htps://etcd:2379"}, `--etcd-workload-endpoints (the URLs the workloads' etcd clients dial): "htps://etcd:2379" must start with http:// or https://`},
		{[]string{"--etcd-endpoints=http://e:1", "--etcd-workload-endpoints=https://"}, `--etcd-workload-endpoints (the URLs the workloads' etcd clients dial): "https://" has no host`},
		{[]string{"--etcd-endpoints=http://"}, `--etcd-endpoints: "http://" has no host`},
		{[]string{"--etcd-endpoints=http://e:1", "--etcd-probe-timeout=0s"}, "--etcd-probe-timeout must be positive"},
		{[]string{"--etcd-endpoints=http://e:1", "--zap-log-level=129"}, "verbosity 129 is above 128"},
		{[]string{"--etcd-endpoints=http://e:1", "--zap-log-level=200"}, `invalid value "200" for flag -zap-log-level`},
		{[]string{"--etcd-endpoints=http://e:1", "--zap-log-level=99999999999999999999"}, `invalid value "99999999999999999999" for flag -zap-log-level`},
		{[]string{"--etcd-endpoints=http://e:1", "--etcd-revision-configmap=Fencer_Revision"}, `--etcd-revision-configmap: "Fencer_Revision" cannot name the object`},
		{[]string{"--etcd-endpoints=http://e:1", "--etcd-credentials-secret=Fencer_Etcd"}, `--etcd-credentials-secret: "Fencer_Etcd" cannot name the object`},
		{[]string{"--etcd-endpoints=http://e:1", "--leader-election-id=Fencer_Leader"}, `--leader-election-id: "Fencer_Leader" cannot name the object`},
		{[]string{"--etcd-endpoints=http://e:1", "--leader-election-namespace=Fencer_NS"}, `--leader-election-namespace: "Fencer_NS" cannot name the object`},
		{[]string{"--etcd-endpoints=http://e:1", "--webhook-namespace=fencer.system"}, `--webhook-namespace: "fencer.system" cannot name the object`},
		{[]string{"--etcd-endpoints=https://e:1", "--webhook-namespace=fencer-system", "--etcd-pki-secret=Fencer_CA"}, `--etcd-pki-secret: "Fencer_CA" cannot name the object`},
		{[]string{"--etcd-endpoints=http://e:1", "--webhook-secret=cert/x"}, `--webhook-secret: "cert/x" cannot name the object`},
		{[]string{"--etcd-endpoints=http://e:1", "--webhook-service=fencer.webhook"}, `--webhook-service: "fencer.webhook" cannot name the object`},
		{[]string{"--etcd-endpoints=http://e:1", "--webhook-config-name=Fencer"}, `--webhook-config-name: "Fencer" cannot name the object`},
		{[]string{"--no-such-flag"}, "flag provided but not defined: -no-such-flag"},
		{[]string{"--etcd-endpoints=http://e:1", "--etcd-server-secret=s"}, "--etcd-server-secret needs --etcd-pki-secret"},
		{[]string{"--etcd-endpoints=http://e:1", "--etcd-backup-secret=s"}, "--etcd-backup-secret needs --etcd-pki-secret"},
		{[]string{"--etcd-endpoints=http://e:1", "--etcd-pki-secret=p", "--etcd-viewer-secret=v"}, "--etcd-viewer-secret needs --etcd-pki-secret (the CA to issue from) and --etcd-enable-auth"},
		{[]string{"--etcd-endpoints=http://e:1", "--identity-namespaces=ok,Bad_NS"}, `--identity-namespaces: "Bad_NS" is not a namespace name`},
		{[]string{"--etcd-endpoints=http://e:1", "--etcd-credentials-secret="}, "--etcd-credentials-secret must not be empty"},
		{[]string{"--etcd-endpoints=http://e:1", "--etcd-step-down-after=-1s"}, "must not be negative"},
		{[]string{"--etcd-endpoints=http://e:1", "--etcd-enable-auth"}, "--etcd-enable-auth needs an identity with the root role"},
		{[]string{"--etcd-endpoints=http://e:1", "--etcd-prefix=/a:b"}, "must not contain ':'"},
		{[]string{"--etcd-endpoints=http://e:1", "--etcd-election-ttl=500ms"}, "--etcd-election-ttl must be at least 1s, got 500ms"},
		{[]string{"--etcd-endpoints=http://e:1", "--etcd-election-ttl=1500ms"}, "--etcd-election-ttl must be whole seconds (etcd leases are), got 1.5s"},
		{[]string{"--etcd-endpoints=http://e:1", "--webhook-port=70000"}, "--webhook-port must be between 0 and 65535, got 70000"},
		{[]string{"--etcd-endpoints=http://e:1", "--webhook-port=0", "--webhook-cert-rotation"}, "--webhook-cert-rotation needs the webhook server; --webhook-port is 0"},
		{[]string{"--etcd-endpoints=http://e:1", "--webhook-cert-rotation", "--webhook-namespace="}, "--webhook-cert-rotation needs --webhook-namespace"},
		{[]string{"--etcd-endpoints=https://e:1", "--etcd-pki-secret=ca", "--webhook-namespace="}, "--etcd-pki-secret needs --webhook-namespace"},
		// TLS set up, but an endpoint the etcd client would send plain text.
		{[]string{"--etcd-endpoints=https://e:1,http://f:2", "--etcd-ca-file=/nonexistent/ca.pem"}, `--etcd-endpoints: "http://f:2" is http://, but TLS is set up: the etcd client would send it plain text, without the CA check or the client certificate; write https://f:2`},
		{[]string{"--etcd-endpoints=http://e:1", "--etcd-pki-secret=ca", "--webhook-namespace=ns"}, `--etcd-endpoints (the manager uses TLS with --etcd-pki-secret): "http://e:1" is http://`},
		{[]string{"--etcd-endpoints=https://e:1", "--etcd-pki-secret=ca", "--webhook-namespace=ns", "--etcd-workload-endpoints=http://e:1"}, `--etcd-workload-endpoints (the workloads' clients use TLS with --etcd-pki-secret): "http://e:1" is http://`},
		{[]string{"--etcd-endpoints=http://e:1", "--webhook-port=8443"}, "--metrics-bind-address and --webhook-port both listen on port 8443: give each server a port of its own"},
		{[]string{"--etcd-endpoints=http://e:1", "--metrics-bind-address=127.0.0.1:8081"}, "--metrics-bind-address and --health-probe-bind-address both listen on port 8081"},
		{[]string{"--etcd-endpoints=http://e:1", "--pprof-bind-address=127.0.0.1:9443"}, "--pprof-bind-address and --webhook-port both listen on port 9443"},
		{[]string{"--etcd-endpoints=http://e:1", "--exempt-groups=system:masters, system:authenticated"}, "--exempt-groups names system:authenticated: every write by its members"},
		{[]string{"--etcd-endpoints=http://e:1", "--kube-api-qps=0"}, "--kube-api-qps and --kube-api-burst must be positive, got 0 and"},
		{[]string{"--etcd-endpoints=http://e:1", "--lease-workers=0"}, "--lease-workers must be at least 1, got 0"},
		{[]string{"--etcd-endpoints=http://e:1", "--lease-finalizer-namespaces=kube-system,Bad_NS"}, `--lease-finalizer-namespaces: "Bad_NS" is not a namespace name`},
		{[]string{"--etcd-endpoints=http://e:1", "--webhook-port=0", "--lease-delete-webhook"}, "--lease-delete-webhook needs the webhook server; --webhook-port is 0"},
		{[]string{"--etcd-endpoints=http://e:1", "--webhook-client-names=kube-apiserver"}, "--webhook-client-names needs --webhook-client-ca-file"},
		{[]string{"--etcd-endpoints=http://e:1", "--webhook-port=0", "--webhook-client-ca-file=ca.crt"}, "--webhook-client-ca-file needs the webhook server; --webhook-port is 0"},
		{[]string{"--etcd-endpoints=http://e:1", "--webhook-client-ca-file=/no/such/ca.crt"}, "--webhook-client-ca-file: open /no/such/ca.crt: no such file or directory"},
		{[]string{"--etcd-endpoints=http://e:1", "--webhook-client-ca-file=options_test.go"}, "--webhook-client-ca-file options_test.go holds no PEM certificate"},
	}
	for _, tc := range cases {
		_, err := parseFlagsQuiet(tc.args)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("parseFlags(%q) = %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
}

func TestHelpListsEveryFlag(t *testing.T) {
	var out strings.Builder
	_, err := parseFlagsTo([]string{"--help"}, &out)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("--help returned %v", err)
	}
	for _, f := range []string{"etcd-endpoints", "etcd-prefix", "etcd-ca-file", "etcd-cert-file", "etcd-key-file", "etcd-dial-timeout", "metrics-bind-address", "health-probe-bind-address", "leader-elect", "leader-elect-lease-duration", "kubeconfig", "zap-log-level"} {
		if !strings.Contains(out.String(), "-"+f) {
			t.Errorf("--help does not list --%s", f)
		}
	}
}

func parseFlagsQuiet(args []string) (*options, error) { return parseFlagsTo(args, io.Discard) }

// TestOperationsDocListsEveryFlag keeps docs/operations.md in step with the
// flags: a new flag without a row there fails.
func TestOperationsDocListsEveryFlag(t *testing.T) {
	doc, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	(&options{}).flagSet().VisitAll(func(f *flag.Flag) {
		if !strings.Contains(string(doc), "`--"+f.Name+"`") {
			t.Errorf("docs/operations.md does not document --%s", f.Name)
		}
	})
}

// The log levels a user may give are still taken: a name, or a verbosity
// up to 128, and a logger at 128 still logs errors.
func TestLogLevelsUpTo128AreTaken(t *testing.T) {
	for _, level := range []string{"debug", "info", "error", "1", "5", "128"} {
		o, err := parseFlagsQuiet([]string{"--etcd-endpoints=http://e:1", "--zap-log-level=" + level})
		if err != nil {
			t.Errorf("--zap-log-level=%s: %v", level, err)
			continue
		}
		var out bytes.Buffer
		o.zap.DestWriter = &out
		zap.New(zap.UseFlagOptions(&o.zap)).Error(errors.New("etcd unreachable"), "a reconcile failed")
		if !strings.Contains(out.String(), "etcd unreachable") {
			t.Errorf("--zap-log-level=%s: an error logged nothing (%q)", level, out.String())
		}
	}
}

// --help lists every flag without a panic of the flag package's: it makes
// a zero value of each flag's type to find its default, and the
// --zap-log-level wrapper must answer for one.
func TestHelpListsTheFlagsWithoutAPanic(t *testing.T) {
	var out bytes.Buffer
	if _, err := parseFlagsTo([]string{"--help"}, &out); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("--help: %v", err)
	}
	if strings.Contains(out.String(), "panic calling") || !strings.Contains(out.String(), "a verbosity from 1 to 128") {
		t.Fatalf("--help printed:\n%s", out.String())
	}
}
