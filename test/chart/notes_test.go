package chart

import (
	"strings"
	"testing"
)

// TestNotesWarnOfAnOpenWebhookPort checks that the install's notes say
// when any pod can post the webhook a made-up review, and only then: a
// narrowed NetworkPolicy or a client CA closes the port to all but the
// apiserver.
func TestNotesWarnOfAnOpenWebhookPort(t *testing.T) {
	const warning = "any pod that reaches the webhook port can post a made-up review"
	for _, c := range []struct {
		name string
		args []string
		warn bool
	}{
		{"default", nil, true},
		{"policy off, peers set", []string{"--set", "networkPolicy.enabled=false", "--set", "networkPolicy.webhookFrom[0].ipBlock.cidr=10.0.0.1/32"}, true},
		{"peers set", []string{"--set", "networkPolicy.webhookFrom[0].ipBlock.cidr=10.0.0.1/32"}, false},
		{"client CA", []string{"--set", "webhook.clientCA.configMap=apiserver-ca"}, false},
		{"client CA, policy off", []string{"--set", "webhook.clientCA.configMap=apiserver-ca", "--set", "networkPolicy.enabled=false"}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			files, err := renderFiles(c.args...)
			if err != nil {
				t.Fatal(err)
			}
			notes, ok := files["fencer/templates/NOTES.txt"]
			if !ok {
				t.Fatal("no NOTES.txt rendered")
			}
			if got := strings.Contains(notes, warning); got != c.warn {
				t.Errorf("warning shown: %v, want %v; notes:\n%s", got, c.warn, notes)
			}
		})
	}
	files, err := renderFiles("--set", "leaseDeletion.webhook=true")
	if err != nil {
		t.Fatal(err)
	}
	if notes := files["fencer/templates/NOTES.txt"]; !strings.Contains(notes, "a made-up DELETE\nends a Lease's tenure") {
		t.Errorf("with leaseDeletion.webhook, the notes do not say a made-up DELETE ends a tenure:\n%s", notes)
	}
}
