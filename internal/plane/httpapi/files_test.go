package httpapi_test

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/airlockhq/airlock/api"
)

func TestFiles(t *testing.T) {
	h := newHarness(t)
	sb := h.create("acme", api.CreateSandboxRequest{})
	key := h.key("acme")
	base := "/v1/sandboxes/" + sb.ID
	// Upload creates parents, returns path and size.
	r := h.req("PUT", base+"/files?path=/home/user/data/a.csv&mode=0600", key, "x,y\n1,2\n")
	h.expect(r, http.StatusCreated, "")
	var fw api.FileWritten
	r.json(t, &fw)
	if fw.Path != "/home/user/data/a.csv" || fw.Size != 8 {
		t.Fatalf("upload answer %+v", fw)
	}
	// The file is there for commands, owned by the user, with the mode.
	res := h.exec("acme", sb.ID, api.ExecRequest{Shell: sh(`cat ~/data/a.csv`)})
	if strp(res.Stdout) != "x,y\n1,2\n" {
		t.Fatalf("exec sees %q", strp(res.Stdout))
	}
	var fi api.FileInfo
	h.req("GET", base+"/fs/stat?path=/home/user/data/a.csv", key, nil).json(t, &fi)
	if fi.Type != "file" || fi.Size != 8 || fi.Mode != "0600" || fi.Name != "a.csv" {
		t.Fatalf("stat %+v", fi)
	}
	// Download.
	r = h.req("GET", base+"/files?path=/home/user/data/a.csv", key, nil)
	h.expect(r, http.StatusOK, "")
	if string(r.body) != "x,y\n1,2\n" || r.Header.Get("Content-Type") != "application/octet-stream" || r.Header.Get("Content-Length") != "8" {
		t.Fatalf("download %q %v", r.body, r.Header)
	}
	// mkdir, move, list.
	h.expect(h.req("POST", base+"/fs/mkdir", key, api.MkdirRequest{Path: "/home/user/out/deep"}), http.StatusCreated, "")
	r = h.req("POST", base+"/fs/move", key, api.MoveRequest{From: "/home/user/data/a.csv", To: "/home/user/out/deep/b.csv"})
	h.expect(r, http.StatusOK, "")
	var list api.FileList
	h.req("GET", base+"/fs/list?path=/home/user&depth=3", key, nil).json(t, &list)
	var paths []string
	for _, e := range list.Entries {
		paths = append(paths, e.Path)
	}
	sort.Strings(paths)
	want := "[/home/user/data /home/user/out /home/user/out/deep /home/user/out/deep/b.csv]"
	if got := strings.Join(paths, " "); "["+got+"]" != want {
		t.Fatalf("list %v, want %s", paths, want)
	}
	// Tar in and a directory out as tar.
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	for name, body := range map[string]string{"proj/main.py": "print(1)\n", "proj/README": "hi\n"} {
		tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg})
		tw.Write([]byte(body))
	}
	tw.Close()
	h.expect(h.req("PUT", base+"/files?path=/home/user/src", key, tb.Bytes(), "Content-Type", "application/x-tar"), http.StatusCreated, "")
	if res := h.exec("acme", sb.ID, api.ExecRequest{Shell: sh(`cat ~/src/proj/main.py`)}); strp(res.Stdout) != "print(1)\n" {
		t.Fatalf("tar upload not unpacked: %q", strp(res.Stdout))
	}
	r = h.req("GET", base+"/files?path=/home/user/src", key, nil)
	h.expect(r, http.StatusOK, "")
	if r.Header.Get("Content-Type") != "application/x-tar" {
		t.Fatalf("directory download type %q", r.Header.Get("Content-Type"))
	}
	found := map[string]string{}
	tr := tar.NewReader(bytes.NewReader(r.body))
	for {
		hd, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		found[strings.TrimPrefix(hd.Name, "./")] = string(b)
	}
	if found["proj/main.py"] != "print(1)\n" {
		t.Fatalf("directory tar holds %v", found)
	}
	// A tar that tries to climb out is refused.
	tb.Reset()
	tw = tar.NewWriter(&tb)
	tw.WriteHeader(&tar.Header{Name: "../../escape", Mode: 0o644, Size: 1, Typeflag: tar.TypeReg})
	tw.Write([]byte("x"))
	tw.Close()
	h.expect(h.req("PUT", base+"/files?path=/home/user/src", key, tb.Bytes(), "Content-Type", "application/x-tar"), 400, api.CodeInvalidArgument)
	// Files outside the user's reach: permission denied, not a 500.
	if os.Geteuid() == 0 {
		h.expect(h.req("PUT", base+"/files?path=/root/x", key, "no"), 403, api.CodePermissionDenied)
	}
	// Delete: a non-empty directory needs recursive.
	h.expect(h.req("DELETE", base+"/fs?path=/home/user/out", key, nil), 400, api.CodeInvalidArgument)
	h.expect(h.req("DELETE", base+"/fs?path=/home/user/out&recursive=true", key, nil), http.StatusNoContent, "")
	h.expect(h.req("GET", base+"/fs/stat?path=/home/user/out", key, nil), 404, api.CodeNotFound)
	h.expect(h.req("GET", base+"/files?path=/home/user/nope", key, nil), 404, api.CodeNotFound)
	// Nothing reached the host outside the sandbox root.
	if _, err := os.Stat(filepath.Join(filepath.Dir(h.drv.Root(sb.ID)), "escape")); err == nil {
		t.Fatal("tar escaped the sandbox root")
	}
}

func TestPTY(t *testing.T) {
	h := newHarness(t)
	sb := h.create("acme", api.CreateSandboxRequest{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	hdr := http.Header{"Authorization": {"Bearer " + h.key("acme")}}
	url := "ws" + strings.TrimPrefix(h.url, "http") + "/v1/sandboxes/" + sb.ID + "/pty?cols=100&rows=30&cmd=/bin/sh"
	conn, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPHeader: hdr})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseNow()
	if err := conn.Write(ctx, websocket.MessageText, []byte(`{"resize":{"cols":120,"rows":40}}`)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if err := conn.Write(ctx, websocket.MessageBinary, []byte("stty size; echo mark-$((6*7)); exit 4\n")); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	var exit map[string]api.ExecResult
	for {
		typ, data, err := conn.Read(ctx)
		if websocket.CloseStatus(err) == websocket.StatusNormalClosure {
			break
		}
		if err != nil {
			t.Fatalf("read: %v (output so far %q)", err, out.String())
		}
		if typ == websocket.MessageBinary {
			out.WriteString(string(data))
		} else if err := json.Unmarshal(data, &exit); err != nil {
			t.Fatalf("text frame %q: %v", data, err)
		}
	}
	if !strings.Contains(out.String(), "mark-42") || !strings.Contains(out.String(), "40 120") {
		t.Fatalf("terminal output %q", out.String())
	}
	if res := exit["exit"]; intp(res.ExitCode) != "4" {
		t.Fatalf("exit frame %+v", exit)
	}
	// Bad requests get the API's error before any upgrade.
	h.expect(h.req("GET", "/v1/sandboxes/"+sb.ID+"/pty?cols=0", h.key("acme"), nil), 400, api.CodeInvalidArgument)
	h.expect(h.req("GET", "/v1/sandboxes/"+sb.ID+"/pty", h.key("evil"), nil), 404, api.CodeSandboxNotFound)
	// A plain GET (no upgrade) gets the API's JSON error, and starts nothing.
	execs := func() int {
		var l api.ExecList
		h.req("GET", "/v1/sandboxes/"+sb.ID+"/execs", h.key("acme"), nil).json(t, &l)
		return len(l.Execs)
	}
	before := execs()
	r := h.req("GET", "/v1/sandboxes/"+sb.ID+"/pty", h.key("acme"), nil)
	h.expect(r, 400, api.CodeInvalidArgument)
	if ct := r.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("non-upgrade answer has Content-Type %q", ct)
	}
	if e := r.apiErr(t); !strings.Contains(e.Message, "websocket") || e.SandboxID != sb.ID {
		t.Errorf("non-upgrade error %+v", e)
	}
	if n := execs(); n != before {
		t.Errorf("a refused terminal started a command: %d execs, had %d", n, before)
	}
}

// TestRoutesMatchOpenAPI keeps the registered routes and api/openapi.yaml's
// `paths` in step: every route is in the spec, every implemented operation of
// the spec is a route.
func TestRoutesMatchOpenAPI(t *testing.T) {
	// The spec is part of the repository: without it this is a failure.
	f, err := os.Open(filepath.Join("..", "..", "..", "api", "openapi.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	spec := parseOpenAPIPaths(t, f)
	h := newHarness(t)
	routes := map[string]bool{}
	for _, r := range h.srv.Routes() {
		routes[normalizeRoute(r)] = true
	}
	for r := range routes {
		op, ok := spec[r]
		if !ok {
			t.Errorf("route %s is not in api/openapi.yaml", r)
		} else if op.planned {
			t.Errorf("route %s is served but marked planned in api/openapi.yaml", r)
		}
	}
	for r, op := range spec {
		if !op.planned && !routes[r] {
			t.Errorf("api/openapi.yaml has %s (implemented) but the server has no such route", r)
		}
	}
}

type specOp struct{ planned bool }

var paramRE = regexp.MustCompile(`\{[^}]*\}`)

// normalizeRoute turns "GET /v1/keys/{kid}" into "GET /v1/keys/{}":
// parameter names may differ between the spec and the mux.
func normalizeRoute(r string) string { return paramRE.ReplaceAllString(r, "{}") }

// parseOpenAPIPaths reads the operations under `paths:` with a line parser
// (two-space path keys, four-space method keys, x-airlock-status at path or
// operation level) rather than a YAML library.
func parseOpenAPIPaths(t *testing.T, r io.Reader) map[string]specOp {
	t.Helper()
	out := map[string]specOp{}
	sc := bufio.NewScanner(r)
	inPaths := false
	var path string
	pathPlanned := false
	var ops []string
	flush := func() {
		for _, op := range ops {
			out[op] = specOp{planned: pathPlanned || out[op].planned}
		}
		ops = nil
	}
	lastOp := ""
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), " ")
		switch {
		case line == "paths:":
			inPaths = true
			continue
		case !inPaths || line == "" || strings.HasPrefix(strings.TrimSpace(line), "#"):
			continue
		case !strings.HasPrefix(line, " "):
			flush()
			inPaths = false
			continue
		}
		if strings.HasPrefix(line, "  /") && strings.HasSuffix(line, ":") && !strings.HasPrefix(line, "   ") {
			flush()
			path = normalizeRoute(strings.TrimSuffix(strings.TrimSpace(line), ":"))
			path = strings.Trim(path, `"'`)
			pathPlanned = false
			continue
		}
		if strings.HasPrefix(line, "    ") && !strings.HasPrefix(line, "     ") {
			key := strings.TrimSpace(line)
			switch key {
			case "get:", "post:", "put:", "delete:", "patch:":
				lastOp = strings.ToUpper(strings.TrimSuffix(key, ":")) + " " + path
				ops = append(ops, lastOp)
			case "x-airlock-status: planned":
				pathPlanned = true
			}
			continue
		}
		if strings.HasPrefix(line, "      x-airlock-status: planned") && lastOp != "" {
			out[lastOp] = specOp{planned: true}
		}
	}
	flush()
	if len(out) == 0 {
		t.Fatal("no paths parsed from api/openapi.yaml")
	}
	return out
}
