package e2b_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"io"
	"mime/multipart"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestSignedFileURLs: the SDKs' downloadUrl/uploadUrl URLs carry no
// header and no token; the plane finds their sandbox by the signature,
// refuses an expired one, a wrong one, and one used for another path,
// operation, user or sandbox, and serves the rest as the signed user.
func TestSignedFileURLs(t *testing.T) {
	h := newHarness(t)
	a := h.create("acme")
	b := h.create("globex")
	h.upload(a, "hello.txt", "hello world")
	h.upload(b, "hello.txt", "other tenant")
	signed := func(c created, p, op, user string, exp int64) string {
		e := ""
		if exp != 0 {
			e = strconv.FormatInt(exp, 10)
		}
		q := url.Values{"path": {p}, "signature": {sdkSignature(p, op, user, c.EnvdAccessToken, e)}}
		if user != "" {
			q.Set("username", user)
		}
		if e != "" {
			q.Set("signature_expiration", e)
		}
		return h.url + "/files?" + q.Encode()
	}
	get := func(u string) (int, string) {
		t.Helper()
		resp, err := http.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	later := time.Now().Add(time.Minute).Unix()
	if st, body := get(signed(a, "hello.txt", "read", "", later)); st != http.StatusOK || body != "hello world" {
		t.Fatalf("valid signed download: %d %q", st, body)
	}
	if st, body := get(signed(b, "hello.txt", "read", "", 0)); st != http.StatusOK || body != "other tenant" {
		t.Fatalf("signed download without expiration, of the other sandbox: %d %q", st, body)
	}
	if st, body := get(signed(a, "hello.txt", "read", "", time.Now().Add(-10*time.Second).Unix())); st != http.StatusUnauthorized ||
		!strings.Contains(body, `"message":"signature is already expired"`) {
		t.Fatalf("expired signature: %d %s", st, body)
	}
	// The signature covers the path, the operation and the user.
	u := signed(a, "hello.txt", "read", "", later)
	for name, bad := range map[string]string{
		"another path": strings.Replace(u, "path=hello.txt", "path=%2Fetc%2Fshadow", 1),
		"another user": u + "&username=root",
		"a write's":    signed(a, "hello.txt", "write", "", later),
		"garbage":      h.url + "/files?path=hello.txt&signature=v1_AAAA",
		"a later end":  strings.Replace(u, strconv.FormatInt(later, 10), strconv.FormatInt(later+3600, 10), 1),
	} {
		if st, body := get(bad); st != http.StatusUnauthorized || strings.Contains(body, "hello world") {
			t.Errorf("signature of %s: %d %q, want 401", name, st, body)
		}
	}
	// A signed upload writes as the signed user.
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	fw, _ := mw.CreateFormFile("file", "up.txt")
	fw.Write([]byte("uploaded"))
	mw.Close()
	req, _ := http.NewRequest("POST", signed(a, "up.txt", "write", "root", later), &body)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	rb, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(rb), `"path":"/root/up.txt"`) {
		t.Fatalf("signed upload as root: %d %s", resp.StatusCode, rb)
	}
	if st, got := get(signed(a, "/root/up.txt", "read", "root", later)); st != http.StatusOK || got != "uploaded" {
		t.Fatalf("download of the signed upload: %d %q", st, got)
	}
	// Unsigned, a /files call without the routing header is not the plane's.
	if st, _ := get(h.url + "/files?path=hello.txt"); st == http.StatusOK {
		t.Fatal("an unsigned /files without header was served")
	}
}

// sdkSignature signs as the SDK's getSignature (js-sdk src/sandbox/signature.ts).
func sdkSignature(p, op, user, token, exp string) string {
	raw := p + ":" + op + ":" + user + ":" + token
	if exp != "" {
		raw += ":" + exp
	}
	sum := sha256.Sum256([]byte(raw))
	return "v1_" + strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "=")
}
