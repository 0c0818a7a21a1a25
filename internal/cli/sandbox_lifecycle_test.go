package cli

import (
	"strings"
	"testing"

	"github.com/airlockhq/airlock/api"
)

// TestCreateLifecycleFlags: --on-timeout, --idle-timeout and --auto-resume
// become the create's lifecycle; bad values are usage errors.
func TestCreateLifecycleFlags(t *testing.T) {
	f, srv := newFakeAPI(t)
	r := runCLI(t, srv.URL, "sandbox", "create", "--on-timeout", "pause", "--idle-timeout", "10m", "--auto-resume")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	f.mu.Lock()
	req := f.created[len(f.created)-1]
	f.mu.Unlock()
	l := req.Lifecycle
	if l == nil || l.OnTimeout != api.OnTimeoutPause || l.IdleTimeoutS == nil || *l.IdleTimeoutS != 600 || l.AutoResume == nil || !*l.AutoResume {
		t.Fatalf("lifecycle %+v", l)
	}
	r = runCLI(t, srv.URL, "sandbox", "create")
	f.mu.Lock()
	req = f.created[len(f.created)-1]
	f.mu.Unlock()
	if r.code != 0 || req.Lifecycle != nil {
		t.Fatalf("no flags: exit %d, lifecycle %+v", r.code, req.Lifecycle)
	}
	if r := runCLI(t, srv.URL, "sandbox", "create", "--on-timeout", "explode"); r.code == 0 || !strings.Contains(r.stderr, "kill or pause") {
		t.Fatalf("bad --on-timeout: exit %d %q", r.code, r.stderr)
	}
}

// TestPauseDiskFlag: pause --disk asks for memory disk.
func TestPauseDiskFlag(t *testing.T) {
	f, srv := newFakeAPI(t)
	f.addSandbox("sbx_1")
	if r := runCLI(t, srv.URL, "sandbox", "pause", "--disk", "sbx_1"); r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	if r := runCLI(t, srv.URL, "sandbox", "keepalive", "sbx_1"); r.code != 0 || !strings.HasPrefix(r.stdout, "sbx_1 ") {
		t.Fatalf("keepalive: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
}
