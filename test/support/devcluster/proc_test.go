package devcluster

import (
	"strings"
	"testing"
)

// A process that dies at once is reported with the end of its log, which is
// all CI keeps of it.
func TestAnEarlyExitQuotesTheLog(t *testing.T) {
	p, err := startProc(t.TempDir(), "sh", "/bin/sh", "-c", "echo starting; echo 'bind: address already in use' >&2; exit 1")
	if err != nil {
		t.Fatal(err)
	}
	<-p.done
	err = p.exited()
	if err == nil || !strings.Contains(err.Error(), "address already in use") {
		t.Errorf("exited() = %v; want it to quote the log", err)
	}
}
