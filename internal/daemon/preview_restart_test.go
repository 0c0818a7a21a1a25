package daemon

import (
	"context"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/client"
	"github.com/airlockhq/airlock/internal/testutil"
)

// previewFetch GETs a preview URL from the preview listener at addr,
// whatever its host name resolves to, without following redirects.
func previewFetch(t *testing.T, addr, rawURL, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, rawURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set(api.PreviewTokenHeader, token)
	}
	tr := &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", rawURL, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestPreviewSurvivesDaemonKill: a port exposed before the daemon was
// SIGKILLed answers at the same preview URL, with the same token, once
// another daemon started on the same data dir re-adopted the sandbox.
func TestPreviewSurvivesDaemonKill(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real airlock serve processes and a runc sandbox")
	}
	testutil.RequiresRoot(t)
	testutil.RequiresBinary(t, "runc")
	agent, bin := buildBinaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	dataDir, leaks := restartDataDir(t, ctx, "airlock-preview-restart-")

	const key = "admin-key-for-the-preview-restart-test-7"
	addr, previewAddr := freeLoopbackAddr(t), freeLoopbackAddr(t)
	// startServe passes the test's environment on to the daemon.
	t.Setenv("AIRLOCK_PREVIEW_LISTEN", previewAddr)
	d1 := startServe(t, bin, agent, dataDir, addr, key, 5)
	var d2 *servedProc
	c, err := client.New("http://"+addr, key)
	if err != nil {
		t.Fatal(err)
	}
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "base"})
	if err != nil {
		d1.kill()
		t.Fatalf("create: %v\n%s", err, d1.logs.String())
	}
	t.Cleanup(func() {
		if d2 == nil {
			d1.kill()
			d2 = startServe(t, bin, agent, dataDir, addr, key, 5)
		}
		dctx, dcancel := context.WithTimeout(context.Background(), time.Minute)
		defer dcancel()
		if err := c.DeleteSandbox(dctx, sb.ID); err != nil {
			t.Errorf("delete: %v", err)
		}
		if err := d2.term(); err != nil {
			t.Errorf("second daemon: %v", err)
		}
		if t.Failed() {
			t.Logf("first daemon log:\n%s\nsecond daemon log:\n%s", d1.logs.String(), d2.logs.String())
		}
		reapAdopted(t)
		leaks.AssertNoLeaks(t)
	})

	shell := `mkdir -p /home/user/www && echo "kept across a kill" > /home/user/www/index.html
(setsid python3 -m http.server 8080 --bind 127.0.0.1 -d /home/user/www >/dev/null 2>&1 &)
for i in $(seq 100); do python3 -c 'import socket; socket.create_connection(("127.0.0.1", 8080)).close()' 2>/dev/null && echo up && exit 0; sleep 0.1; done; echo down`
	res, err := c.Exec(ctx, sb.ID, api.ExecRequest{Shell: &shell})
	if err != nil || res.Stdout == nil || *res.Stdout != "up\n" {
		t.Fatalf("server in the sandbox: %+v %v", res, err)
	}
	pv, err := c.CreatePreview(ctx, sb.ID, 8080, false)
	if err != nil {
		t.Fatal(err)
	}
	if code, body := previewFetch(t, previewAddr, pv.URL, pv.Token); code != http.StatusOK || body != "kept across a kill\n" {
		t.Fatalf("before the kill: %d %q", code, body)
	}

	d1.kill()
	d2 = startServe(t, bin, agent, dataDir, addr, key, 5)

	list, err := c.ListPreviews(ctx, sb.ID)
	if err != nil || len(list) != 1 || list[0].Port != 8080 || list[0].URL != pv.URL || list[0].Token != pv.Token || list[0].Public {
		t.Fatalf("previews after the restart %+v %v, want %+v", list, err, *pv)
	}
	if code, body := previewFetch(t, previewAddr, pv.URL, pv.Token); code != http.StatusOK || body != "kept across a kill\n" {
		t.Fatalf("after the restart: %d %q", code, body)
	}
	if code, _ := previewFetch(t, previewAddr, pv.URL, ""); code == http.StatusOK {
		t.Fatal("the private preview answered without its token after the restart")
	}
}
