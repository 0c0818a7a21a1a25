package e2b_test

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/airlockhq/airlock/internal/auth"
	fspb "github.com/airlockhq/airlock/internal/plane/e2b/envd/filesystempb"
)

// TestFilesystemNonUTF8: envd's messages hold names as protobuf strings,
// which must be UTF-8. A directory holding a name that is not is refused
// with invalid_argument naming it, never listed under a rewritten name; a
// change to such a name ends a watch as lost events.
func TestFilesystemNonUTF8(t *testing.T) {
	h := newHarness(t)
	c := h.create("acme")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	untar := func(names ...string) {
		t.Helper()
		var tb bytes.Buffer
		tw := tar.NewWriter(&tb)
		for _, n := range names {
			tw.WriteHeader(&tar.Header{Name: n, Mode: 0o644, Size: 1, Typeflag: tar.TypeReg})
			tw.Write([]byte("x"))
		}
		tw.Close()
		if _, err := h.svc.Files.TarIn(ctx, auth.Principal{Tenant: "acme"}, c.SandboxID, "/home/user/u8", "", &tb); err != nil {
			t.Fatal(err)
		}
	}
	untar("d/a\xff", "d/a\xfe", "w/ok")
	for _, codec := range codecs {
		t.Run(codec.name, func(t *testing.T) {
			fc := h.filesystem(c, codec.opts)
			ls, err := fc.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: "/home/user/u8/d"}))
			if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), `a\xfe`) {
				t.Fatalf("ListDir = %v, %v; want invalid_argument naming the entry", ls, err)
			}
		})
	}
	t.Run("watch", func(t *testing.T) {
		fc := h.filesystem(c, codecs[0].opts)
		stream, err := fc.WatchDir(ctx, connect.NewRequest(&fspb.WatchDirRequest{Path: "/home/user/u8/w"}))
		if err != nil {
			t.Fatal(err)
		}
		defer stream.Close()
		if !stream.Receive() || stream.Msg().GetStart() == nil {
			t.Fatalf("first watch event is not start: %v %v", stream.Msg(), stream.Err())
		}
		untar("w/b\xfd")
		for stream.Receive() {
			if ev := stream.Msg().GetFilesystem(); ev != nil {
				t.Fatalf("event %v for a name no event can carry", ev)
			}
		}
		if err := stream.Err(); connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), "UTF-8") {
			t.Fatalf("watch ended with %v, want lost events", err)
		}
	})
	t.Run("rest", func(t *testing.T) {
		resp, err := h.client(c).Get(h.url + "/files?path=/home/user/u8/d/a%FF")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "UTF-8") {
			t.Fatalf("GET /files of a non-UTF-8 path: %d %s", resp.StatusCode, b)
		}
	})
}
