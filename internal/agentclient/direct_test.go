package agentclient_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/agent"
	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// transport is how a test client reaches its agent.
type transport int

const (
	// viaSession: one socketpair, no dialer: every call on a yamux stream.
	viaSession transport = iota
	// viaSocket: a listening unix socket the client dials again for each
	// transfer, as the daemon does: splice and sendfile in play.
	viaSocket
	// viaPipe: direct connections over in-memory pipes, which have no file
	// descriptor: the protocol without the kernel shortcuts.
	viaPipe
)

func (tr transport) String() string {
	return [...]string{"session", "socket", "pipe"}[tr]
}

// directAgent is a real agent reached over tr. dials counts the direct
// connections the client opened.
type directAgent struct {
	c      *agentclient.Client
	root   string
	dials  atomic.Int64
	accept func(net.Conn) // serves one connection in the background
}

func startDirectAgent(tb testing.TB, tr transport) *directAgent {
	tb.Helper()
	root := tb.TempDir()
	passwd := filepath.Join(tb.TempDir(), "passwd")
	line := fmt.Sprintf("tester:x:%d:%d::/:/bin/sh\n", os.Geteuid(), os.Getegid())
	if err := os.WriteFile(passwd, []byte(line), 0o644); err != nil {
		tb.Fatal(err)
	}
	srv := agent.NewServer(agent.Config{Root: root, PasswdFile: passwd, DefaultUser: "tester", Subreaper: true})
	var wg sync.WaitGroup
	da := &directAgent{root: root}
	da.accept = func(conn net.Conn) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = srv.ServeConn(context.Background(), conn)
		}()
	}
	var first net.Conn
	var dial func(context.Context) (net.Conn, error)
	var ln net.Listener
	switch tr {
	case viaSession:
		a, b := socketPair(tb)
		da.accept(b)
		first = a
	case viaSocket:
		var err error
		ln, err = net.Listen("unix", filepath.Join(tb.TempDir(), "agent.sock"))
		if err != nil {
			tb.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				conn, err := ln.Accept()
				if err != nil {
					return
				}
				da.accept(conn)
			}
		}()
		dial = func(ctx context.Context) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", ln.Addr().String())
		}
		if first, err = dial(context.Background()); err != nil {
			tb.Fatal(err)
		}
	case viaPipe:
		a, b := net.Pipe()
		da.accept(b)
		first = a
		dial = func(context.Context) (net.Conn, error) {
			a, b := net.Pipe()
			da.accept(b)
			return a, nil
		}
	}
	var opts []agentclient.Option
	if dial != nil {
		opts = append(opts, agentclient.WithDialer(func(ctx context.Context) (net.Conn, error) {
			da.dials.Add(1)
			return dial(ctx)
		}))
	}
	c, err := agentclient.New(first, opts...)
	if err != nil {
		tb.Fatal(err)
	}
	da.c = c
	tb.Cleanup(func() {
		c.Close()
		if ln != nil {
			ln.Close()
		}
		srv.Close()
		wg.Wait()
	})
	return da
}

func randomBytes(tb testing.TB, n int) []byte {
	tb.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		tb.Fatal(err)
	}
	return b
}

// TestDirectTransfers moves files of sizes around the frame boundaries
// through every transport and checks the bytes, both ways, and that direct
// connections are used exactly where they should be.
func TestDirectTransfers(t *testing.T) {
	sizes := []int{0, 1, 4095, agentproto.DirectChunk - 1, agentproto.DirectChunk, agentproto.DirectChunk + 1, 3*agentproto.DirectChunk + 12345}
	for _, tr := range []transport{viaSession, viaSocket, viaPipe} {
		t.Run(tr.String(), func(t *testing.T) {
			da := startDirectAgent(t, tr)
			ctx := ctxT(t)
			for _, size := range sizes {
				t.Run(fmt.Sprint(size), func(t *testing.T) {
					data := randomBytes(t, size)
					p := fmt.Sprintf("/d/f%d", size)
					before := da.dials.Load()
					n, err := da.c.WriteFile(ctx, p, "", 0, bytes.NewReader(data), 0)
					if err != nil || n != int64(size) {
						t.Fatalf("WriteFile = %d, %v", n, err)
					}
					if on, err := os.ReadFile(filepath.Join(da.root, p)); err != nil || !bytes.Equal(on, data) {
						t.Fatalf("file on disk differs (%d bytes, %v)", len(on), err)
					}
					rc, fi, err := da.c.ReadFile(ctx, p, "")
					if err != nil || fi.Size != int64(size) {
						t.Fatalf("ReadFile = %+v, %v", fi, err)
					}
					// Half through Read, the rest through WriteTo (io.Copy):
					// the two paths must join without a gap.
					var got bytes.Buffer
					if _, err := io.CopyN(&got, struct{ io.Reader }{rc}, int64(size/2)); err != nil {
						t.Fatal(err)
					}
					if _, err := io.Copy(&got, rc); err != nil {
						t.Fatal(err)
					}
					rc.Close()
					if !bytes.Equal(got.Bytes(), data) {
						t.Fatalf("download differs: %d bytes, want %d", got.Len(), size)
					}
					wantDials := int64(2)
					if tr == viaSession {
						wantDials = 0
					}
					if d := da.dials.Load() - before; d != wantDials {
						t.Errorf("%d direct connections, want %d", d, wantDials)
					}
				})
			}
		})
	}
}

// TestDirectLimits checks that a direct upload past its limit fails as too
// large and leaves no file, and that the session is unharmed.
func TestDirectLimits(t *testing.T) {
	for _, tr := range []transport{viaSocket, viaPipe} {
		t.Run(tr.String(), func(t *testing.T) {
			da := startDirectAgent(t, tr)
			ctx := ctxT(t)
			data := randomBytes(t, 2*agentproto.DirectChunk)
			_, err := da.c.WriteFile(ctx, "/big", "", 0, bytes.NewReader(data), agentproto.DirectChunk+10)
			if !errors.Is(err, errdefs.ErrTooLarge) {
				t.Fatalf("err = %v, want too large", err)
			}
			if _, err := os.Stat(filepath.Join(da.root, "big")); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("a refused upload left a file: %v", err)
			}
			ents, _ := os.ReadDir(da.root)
			if len(ents) != 0 {
				t.Fatalf("a refused upload left %v", ents)
			}
			if err := da.c.Ping(ctx); err != nil {
				t.Fatal(err)
			}
			if _, _, err := da.c.ReadFile(ctx, "/nope", ""); !errors.Is(err, errdefs.ErrNotFound) {
				t.Fatalf("missing file: %v", err)
			}
		})
	}
}

// TestDirectSourceError checks that a failing upload source aborts the
// direct upload without leaving a partial file.
func TestDirectSourceError(t *testing.T) {
	da := startDirectAgent(t, viaSocket)
	ctx := ctxT(t)
	boom := errors.New("source broke")
	src := io.MultiReader(bytes.NewReader(randomBytes(t, agentproto.DirectChunk+5)), errReader{boom})
	if _, err := da.c.WriteFile(ctx, "/partial", "", 0, src, 0); !errors.Is(err, boom) {
		t.Fatalf("err = %v, want the source's", err)
	}
	// The agent notices the broken connection on its own time.
	deadline := time.Now().Add(5 * time.Second)
	for {
		ents, _ := os.ReadDir(da.root)
		if len(ents) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("an aborted upload left %v", ents)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// fakeDirectAgent answers hello with FeatureDirect, and every direct
// connection's read_file with a response announcing announced bytes, then
// the frames of body, then an end frame.
func fakeDirectAgent(t *testing.T, announced int64, body []byte) *agentclient.Client {
	t.Helper()
	session := fakeAgent(t, func(req agentproto.Request) agentproto.Response {
		return agentproto.Response{Hello: &agentproto.Hello{
			Version: agentproto.ProtocolVersion, Features: []string{agentproto.FeatureDirect},
		}}
	})
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)
	dial := func(context.Context) (net.Conn, error) {
		a, b := socketPair(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer b.Close()
			pre := make([]byte, len(agentproto.DirectPreamble))
			if _, err := io.ReadFull(b, pre); err != nil || string(pre) != agentproto.DirectPreamble {
				return
			}
			fr, fw := agentproto.NewFrameReader(b), agentproto.NewFrameWriter(b)
			var req agentproto.Request
			if fr.ReadJSON(&req) != nil {
				return
			}
			fi := agentproto.FileInfo{Name: "f", Path: "/f", Type: agentproto.FileTypeFile, Size: announced}
			_ = fw.WriteJSON(&agentproto.Response{File: &fi})
			_ = fw.WriteData(body)
			_ = fw.WriteEnd()
		}()
		return a, nil
	}
	c, err := agentclient.New(session, agentclient.WithDialer(dial))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestDirectDownloadSize checks that a download on a direct connection
// yields exactly the size the agent announced: an agent that sends more is
// cut off before the excess reaches the caller (who may have promised the
// size to an HTTP client), one that sends less is a broken transfer.
func TestDirectDownloadSize(t *testing.T) {
	body := bytes.Repeat([]byte("0123456789"), 1000)
	tests := []struct {
		name      string
		announced int64
		wantErr   error
	}{
		{"exact", int64(len(body)), nil},
		{"more_than_announced", int64(len(body)) - 10, agentclient.ErrProtocol},
		{"less_than_announced", int64(len(body)) + 10, io.ErrUnexpectedEOF},
	}
	for _, tt := range tests {
		for _, how := range []string{"read", "write_to"} {
			t.Run(tt.name+"/"+how, func(t *testing.T) {
				c := fakeDirectAgent(t, tt.announced, body)
				rc, _, err := c.ReadFile(ctxT(t), "/f", "")
				if err != nil {
					t.Fatal(err)
				}
				defer rc.Close()
				var got bytes.Buffer
				if how == "read" {
					_, err = io.Copy(&got, struct{ io.Reader }{rc})
				} else {
					_, err = io.Copy(&got, rc)
				}
				if tt.wantErr == nil {
					if err != nil || !bytes.Equal(got.Bytes(), body) {
						t.Fatalf("got %d bytes, %v", got.Len(), err)
					}
					return
				}
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
				if int64(got.Len()) > tt.announced {
					t.Fatalf("delivered %d bytes, more than the %d announced", got.Len(), tt.announced)
				}
			})
		}
	}
}

// TestDirectCancel checks that cancelling a download on a direct connection
// ends it with the context's error.
func TestDirectCancel(t *testing.T) {
	da := startDirectAgent(t, viaSocket)
	ctx := ctxT(t)
	if _, err := da.c.WriteFile(ctx, "/big", "", 0, bytes.NewReader(make([]byte, 32<<20)), 0); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	rc, _, err := da.c.ReadFile(rctx, "/big", "")
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if _, err := io.ReadFull(rc, make([]byte, 1024)); err != nil {
		t.Fatal(err)
	}
	cancel()
	if _, err := io.Copy(io.Discard, rc); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
}

func benchTransfer(b *testing.B, tr transport, upload bool) {
	da := startDirectAgent(b, tr)
	ctx := context.Background()
	data := make([]byte, 100<<20)
	if _, err := da.c.WriteFile(ctx, "/bench", "", 0, bytes.NewReader(data), 0); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	b.ResetTimer()
	for b.Loop() {
		if upload {
			if _, err := da.c.WriteFile(ctx, "/bench", "", 0, bytes.NewReader(data), 0); err != nil {
				b.Fatal(err)
			}
			continue
		}
		rc, _, err := da.c.ReadFile(ctx, "/bench", "")
		if err != nil {
			b.Fatal(err)
		}
		n, err := io.Copy(io.Discard, rc)
		rc.Close()
		if err != nil || n != int64(len(data)) {
			b.Fatalf("read %d %v", n, err)
		}
	}
}

// BenchmarkTransfer100MiB compares file transfers on session streams and on
// direct connections.
func BenchmarkTransfer100MiB(b *testing.B) {
	for _, tr := range []transport{viaSession, viaSocket} {
		b.Run("upload/"+tr.String(), func(b *testing.B) { benchTransfer(b, tr, true) })
		b.Run("download/"+tr.String(), func(b *testing.B) { benchTransfer(b, tr, false) })
	}
}
