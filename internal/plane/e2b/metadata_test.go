package e2b_test

import (
	"bytes"
	"context"
	"io"
	"maps"
	"mime/multipart"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	fspb "github.com/airlockhq/airlock/internal/plane/e2b/envd/filesystempb"
)

// TestFileMetadataAndWatchEntries: envd 0.6.2-0.6.4 as the SDKs use them:
// an upload's X-Metadata-* headers become the file's metadata (in the
// upload's answer, Stat and ListDir; keys lowercased as header names carry
// no case), an upload without them clears them, a value that is not
// printable ASCII is refused before anything is written, and a watch with
// include_entry gives each event its file's entry.
func TestFileMetadataAndWatchEntries(t *testing.T) {
	h := newHarness(t)
	c := h.create("acme")
	fc := h.filesystem(c, codecs[0].opts)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	upload := func(p, content string, hdr map[string]string) (int, string) {
		var body bytes.Buffer
		mw := multipart.NewWriter(&body)
		fw, _ := mw.CreateFormFile("file", p)
		fw.Write([]byte(content))
		mw.Close()
		req, _ := http.NewRequest("POST", h.url+"/files?path="+url.QueryEscape(p), &body)
		req.Header.Set("Content-Type", mw.FormDataContentType())
		for k, v := range hdr {
			req.Header[k] = []string{v} // as sent, not canonicalised
		}
		resp, err := h.client(c).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	md := map[string]string{"author": "mish", "purpose": "upload"}
	st, body := upload("/home/user/m.txt", "data", map[string]string{"X-Metadata-author": "mish", "X-Metadata-Purpose": "upload"})
	if st != http.StatusOK || !strings.Contains(body, `"metadata":{"author":"mish","purpose":"upload"}`) {
		t.Fatalf("upload with metadata: %d %s", st, body)
	}
	stat, err := fc.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: "/home/user/m.txt"}))
	if err != nil || !maps.Equal(stat.Msg.GetEntry().GetMetadata(), md) {
		t.Fatalf("Stat metadata %v (%v), want %v", stat.Msg.GetEntry().GetMetadata(), err, md)
	}
	ls, err := fc.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: "/home/user"}))
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, e := range ls.Msg.GetEntries() {
		if e.GetName() == "m.txt" {
			found = maps.Equal(e.GetMetadata(), md)
		}
	}
	if !found {
		t.Fatalf("ListDir does not show m.txt with its metadata: %v", ls.Msg.GetEntries())
	}
	if st, body := upload("/home/user/bad.txt", "x", map[string]string{"X-Metadata-good": "bad\tvalue"}); st != http.StatusBadRequest {
		t.Fatalf("a non-printable metadata value: %d %s, want 400", st, body)
	}
	if _, err := fc.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: "/home/user/bad.txt"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("a refused upload left its file: %v", err)
	}

	stream, err := fc.WatchDir(ctx, connect.NewRequest(&fspb.WatchDirRequest{Path: "/home/user", IncludeEntry: true, AllowNetworkMounts: true}))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	if !stream.Receive() || stream.Msg().GetStart() == nil {
		t.Fatalf("first watch event is not start: %v %v", stream.Msg(), stream.Err())
	}
	if st, body := upload("/home/user/m.txt", "second", nil); st != http.StatusOK || strings.Contains(body, "metadata") {
		t.Fatalf("overwrite without metadata: %d %s", st, body)
	}
	for stream.Receive() {
		ev := stream.Msg().GetFilesystem()
		if ev == nil || ev.GetName() != "m.txt" {
			continue
		}
		if ev.GetType() != fspb.EventType_EVENT_TYPE_WRITE {
			t.Fatalf("event of the overwrite: %v, want write", ev)
		}
		if e := ev.GetEntry(); e == nil || e.GetPath() != "/home/user/m.txt" || e.GetSize() != 6 || e.GetMetadata() != nil {
			t.Fatalf("entry of the write event: %v, want m.txt, 6 bytes, no metadata", e)
		}
		return
	}
	t.Fatalf("no event of the overwrite: %v", stream.Err())
}
