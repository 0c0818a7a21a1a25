package httpapi_test

import (
	"archive/tar"
	"bytes"
	"io"
	"net/http"
	"sort"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/airlockhq/airlock/api"
)

// TestFilesNonUTF8 runs checkNonUTF8Files on the in-process agent (the
// root variant, on a runc sandbox, is TestE2ERuncNonUTF8Files).
func TestFilesNonUTF8(t *testing.T) {
	h := newHarness(t)
	sb := h.create("acme", api.CreateSandboxRequest{})
	checkNonUTF8Files(t, h, sb.ID)
}

// TestDecodePathJSON: the JSON bodies that name files refuse what the
// decoder would turn into U+FFFD, and only that.
func TestDecodePathJSON(t *testing.T) {
	h := newHarness(t)
	sb := h.create("acme", api.CreateSandboxRequest{})
	key := h.key("acme")
	mkdir := "/v1/sandboxes/" + sb.ID + "/fs/mkdir"
	for name, body := range map[string]string{
		"raw_byte":       "{\"path\":\"/home/user/m\xff\"}",
		"lone_low":       `{"path":"/home/user/m\udcff"}`,
		"lone_high":      `{"path":"/home/user/m\ud83d"}`,
		"high_then_text": `{"path":"/home/user/m\ud83dx\ude00"}`,
	} {
		t.Run(name, func(t *testing.T) {
			r := h.req("POST", mkdir, key, body)
			h.expect(r, http.StatusBadRequest, api.CodeInvalidArgument)
			if !strings.Contains(r.apiErr(t).Message, "UTF-8") {
				t.Fatalf("message %q", r.apiErr(t).Message)
			}
		})
	}
	for name, body := range map[string]string{
		"pair":             `{"path":"/home/user/\ud83d\ude00"}`,
		"escaped_slash_u":  `{"path":"/home/user/q\\udcff"}`,
		"replacement_char": `{"path":"/home/user/r\ufffd"}`,
	} {
		t.Run(name, func(t *testing.T) {
			h.expect(h.req("POST", mkdir, key, body), http.StatusCreated, "")
		})
	}
}

// checkNonUTF8Files drives the file routes of sandbox id with names that
// are not valid UTF-8. JSON cannot carry them: encoding/json would make
// "a\xff" and "a\xfe" both "a\uFFFD", so a listing would show one name
// twice and an upload to it would write a third file. Every route that
// would have to name one refuses with 400 invalid_argument saying why; a
// tar, which carries names byte for byte, keeps them exactly, both ways.
func checkNonUTF8Files(t *testing.T, h *harness, id string) {
	t.Helper()
	key := h.key("acme")
	base := "/v1/sandboxes/" + id
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	for _, e := range []struct{ name, body string }{{"d/a\xff", "ff"}, {"d/a\xfe", "fe"}} {
		tw.WriteHeader(&tar.Header{Name: e.name, Mode: 0o644, Size: int64(len(e.body)), Typeflag: tar.TypeReg})
		tw.Write([]byte(e.body))
	}
	tw.WriteHeader(&tar.Header{Name: "l", Linkname: "t\xff", Typeflag: tar.TypeSymlink})
	tw.Close()
	h.expect(h.req("PUT", base+"/files?path=/home/user/u8", key, tb.Bytes(), "Content-Type", "application/x-tar"), http.StatusCreated, "")

	// archive downloads the tree as a tar: name → body (or "->target").
	archive := func() map[string]string {
		t.Helper()
		r := h.req("GET", base+"/files?path=/home/user/u8", key, nil)
		h.expect(r, http.StatusOK, "")
		got := map[string]string{}
		tr := tar.NewReader(bytes.NewReader(r.body))
		for {
			hd, err := tr.Next()
			if err == io.EOF {
				return got
			}
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(tr)
			switch hd.Typeflag {
			case tar.TypeSymlink:
				got[hd.Name] = "->" + hd.Linkname
			case tar.TypeReg:
				got[hd.Name] = string(b)
			}
		}
	}
	want := map[string]string{"d/a\xff": "ff", "d/a\xfe": "fe", "l": "->t\xff"}
	same := func(what string) {
		t.Helper()
		got := archive()
		var names []string
		for n, b := range got {
			names = append(names, n)
			if want[n] != b {
				t.Errorf("%s: entry %q holds %q, want %q", what, n, b, want[n])
			}
		}
		if len(got) != len(want) {
			sort.Strings(names)
			t.Errorf("%s: the tree holds %q, want exactly the three names uploaded", what, names)
		}
	}
	same("after the upload")

	refused := func(r resp, what string) {
		t.Helper()
		if r.StatusCode != http.StatusBadRequest {
			t.Errorf("%s: status %d, want 400; body %s", what, r.StatusCode, r.body)
			return
		}
		e := r.apiErr(t)
		if e.Code != api.CodeInvalidArgument || !strings.Contains(e.Message, "UTF-8") || !utf8.ValidString(e.Message) {
			t.Errorf("%s: error %+v, want invalid_argument saying UTF-8", what, e)
		}
	}
	r := h.req("GET", base+"/fs/list?path=/home/user/u8/d", key, nil)
	refused(r, "list")
	if msg := r.apiErr(t).Message; !strings.Contains(msg, `\xfe`) {
		t.Errorf("list: message %q does not name the entry", msg)
	}
	refused(h.req("GET", base+"/fs/list?path=/home/user/u8&depth=2", key, nil), "list depth 2")
	refused(h.req("GET", base+"/fs/stat?path=/home/user/u8/l", key, nil), "stat of a symlink to a non-UTF-8 target")
	refused(h.req("GET", base+"/fs/stat?path=/home/user/u8/d/a%FF", key, nil), "stat")
	refused(h.req("GET", base+"/files?path=/home/user/u8/d/a%FF", key, nil), "download")
	refused(h.req("PUT", base+"/files?path=/home/user/u8/d/a%FF", key, "overwritten"), "upload")
	refused(h.req("PUT", base+"/files?path=/home/user/u8/d/new%FD", key, "new"), "upload of a new name")
	refused(h.req("PUT", base+"/files?path=/home/user/u8/%FF", key, tb.Bytes(), "Content-Type", "application/x-tar"), "tar upload into such a directory")
	refused(h.req("POST", base+"/fs/mkdir", key, `{"path":"/home/user/u8/m\udcff"}`), "mkdir")
	refused(h.req("POST", base+"/fs/move", key, `{"from":"/home/user/u8/l","to":"/home/user/u8/\udcfe"}`), "move")
	refused(h.req("DELETE", base+"/fs?path=/home/user/u8/d/a%FE", key, nil), "delete")
	refused(h.req("GET", base+"/fs/watch?path=/home/user/u8/%FF", key, nil), "watch")
	same("after the refused requests")

	// The tree as a whole can still be removed.
	h.expect(h.req("DELETE", base+"/fs?path=/home/user/u8&recursive=true", key, nil), http.StatusNoContent, "")
	h.expect(h.req("GET", base+"/fs/stat?path=/home/user/u8", key, nil), http.StatusNotFound, api.CodeNotFound)
}

// TestE2ERuncNonUTF8Files is checkNonUTF8Files on a real runc sandbox, with
// names also made by a program inside it.
func TestE2ERuncNonUTF8Files(t *testing.T) {
	e := newE2E(t)
	h := e.h
	sb := h.create("acme", api.CreateSandboxRequest{})
	checkNonUTF8Files(t, h, sb.ID)
	res := h.exec("acme", sb.ID, api.ExecRequest{Shell: sh(`mkdir -p ~/made && echo one > ~/made/"$(printf 'x\377')" && echo two > ~/made/"$(printf 'x\376')"`)})
	if res.ExitCode == nil || *res.ExitCode != 0 {
		t.Fatalf("making the names: %+v", res)
	}
	r := h.req("GET", "/v1/sandboxes/"+sb.ID+"/fs/list?path=/home/user/made", h.key("acme"), nil)
	h.expect(r, http.StatusBadRequest, api.CodeInvalidArgument)
	if msg := r.apiErr(t).Message; !strings.Contains(msg, `x\xfe`) {
		t.Fatalf("message %q does not name the entry", msg)
	}
}
