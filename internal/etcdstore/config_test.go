package etcdstore

import (
	"flag"
	"strings"
	"testing"
	"time"

	"github.com/fencer-io/fencer/pkg/etcdkeys"
)

func TestValidateNamesTheFlag(t *testing.T) {
	good := Config{Endpoints: []string{"http://127.0.0.1:2379"}, Prefix: "/fencer", DialTimeout: time.Second}
	if err := good.Validate(); err != nil {
		t.Fatalf("valid config refused: %v", err)
	}
	cases := []struct {
		name   string
		mutate func(*Config)
		want   string
	}{
		{"no endpoints", func(c *Config) { c.Endpoints = nil }, "--etcd-endpoints is required"},
		{"endpoint without scheme", func(c *Config) { c.Endpoints = []string{"127.0.0.1:2379"} }, `--etcd-endpoints: "127.0.0.1:2379" must start with http:// or https://`},
		{"endpoint without a host", func(c *Config) { c.Endpoints = []string{"http://"} }, `--etcd-endpoints: "http://" has no host`},
		{"endpoint with a port that is no number", func(c *Config) { c.Endpoints = []string{"https://127.0.0.1:abc"} }, `--etcd-endpoints: "https://127.0.0.1:abc" is not a URL`},
		{"endpoint with port 0", func(c *Config) { c.Endpoints = []string{"http://a:1", "https://e:0"} }, `--etcd-endpoints: "https://e:0": port "0" is not a port number`},
		{"endpoint with a port past 65535", func(c *Config) { c.Endpoints = []string{"https://e:70000"} }, `port "70000" is not a port number`},
		{"relative prefix", func(c *Config) { c.Prefix = "fencer" }, `--etcd-prefix: not a fencer etcd prefix: "fencer" must start with '/'`},
		{"a colon in the prefix", func(c *Config) { c.Prefix = "/a:b" }, "must not contain ':'"},
		{"trailing slash", func(c *Config) { c.Prefix = "/fencer/" }, "not end with '/'"},
		{"cert without key", func(c *Config) { c.CertFile = "c.pem" }, "--etcd-cert-file and --etcd-key-file must be given together"},
		{"zero dial timeout", func(c *Config) { c.DialTimeout = 0 }, "--etcd-dial-timeout must be positive"},
		// The etcd client sends an http:// endpoint plain text, without the
		// CA check or the client certificate.
		{"TLS files with an http:// endpoint", func(c *Config) { c.CAFile = "ca.pem" }, `--etcd-endpoints: "http://127.0.0.1:2379" is http://, but TLS is set up`},
		{"a client pair with an http:// endpoint", func(c *Config) { c.CertFile, c.KeyFile = "c.pem", "k.pem" }, "write https://127.0.0.1:2379"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := good
			tc.mutate(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate() = %v, want an error containing %q", err, tc.want)
			}
			if _, err := Connect(c); err == nil {
				t.Fatal("Connect accepted an invalid config")
			}
		})
	}
}

func TestBindFlags(t *testing.T) {
	var c Config
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	c.BindFlags(fs)
	if err := fs.Parse([]string{"--etcd-endpoints= http://a:1, ,https://b:2 ", "--etcd-prefix=/x", "--etcd-dial-timeout=3s"}); err != nil {
		t.Fatal(err)
	}
	if strings.Join(c.Endpoints, "|") != "http://a:1|https://b:2" || c.Prefix != "/x" || c.DialTimeout != 3*time.Second {
		t.Fatalf("flags parsed to %+v", c)
	}
}

func TestMissingTLSFilesAreReported(t *testing.T) {
	c := Config{Endpoints: []string{"https://127.0.0.1:2379"}, Prefix: "/fencer", DialTimeout: time.Second, CAFile: "/nonexistent/ca.pem"}
	_, err := Connect(c)
	if err == nil || !strings.Contains(err.Error(), "etcd client TLS") {
		t.Fatalf("Connect = %v, want an etcd client TLS error", err)
	}
}

func TestKeyLayout(t *testing.T) {
	for got, want := range map[string]string{
		etcdkeys.LeaseKey("/fencer", "ns", "a"):            "/fencer/leases/ns/a",
		etcdkeys.LeasesPrefix("/fencer"):                   "/fencer/leases/",
		etcdkeys.IDRangeNextKey("/p", "ns", "ids"):         "/p/idranges/ns/ids/next",
		etcdkeys.IDRangeSlotsPrefix("/p", "ns", "workers"): "/p/idranges/ns/workers/slots/",
		etcdkeys.LeaderKey("/fencer"):                      "/fencer/controller/leader",
	} {
		if got != want {
			t.Errorf("got %q, want %q", got, want)
		}
	}
}
