// Package agentclient is the host side of the agent protocol: it drives exec and file operations in a sandbox through airlock-agent.
package agentclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/yamux"
	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// helloTimeout bounds the handshake in New: a healthy agent answers in
// microseconds, a stuck transport should not hang sandbox start-up.
const helloTimeout = 10 * time.Second

// Client is a session with one agent. It is safe for concurrent use by many
// goroutines; each call uses its own multiplexed stream, or for bulk
// transfers its own direct connection (see WithDialer).
type Client struct {
	sess  *yamux.Session
	agent agentproto.Hello
	// direct dials a direct connection for a bulk transfer; nil when the
	// transport cannot be dialled again or the agent does not take them.
	direct func(context.Context) (net.Conn, error)

	closeOnce sync.Once
	closeErr  error
}

// Option configures a Client.
type Option func(*options)

type options struct {
	dial func(context.Context) (net.Conn, error)
}

// WithDialer lets the client open direct connections to the agent (a new
// connection to the same agent per call) for file transfers, when the agent
// offers them: without yamux in between, a transfer costs fewer copies and
// the kernel can move the bytes (splice, sendfile). Without it, or if a dial
// fails, transfers use streams of the session.
func WithDialer(dial func(ctx context.Context) (net.Conn, error)) Option {
	return func(o *options) { o.dial = dial }
}

// New performs the handshake on conn and returns a Client that owns conn.
func New(conn net.Conn, opts ...Option) (*Client, error) {
	var o options
	for _, f := range opts {
		f(&o)
	}
	sess, err := yamux.Client(conn, agentproto.YamuxConfig())
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("starting agent session: %w", err)
	}
	// The agent never opens a stream: refuse any it tries (yamux answers
	// each with a reset and keeps nothing of it), so that it cannot park
	// buffered data in the daemon on streams nobody reads.
	if err := sess.GoAway(); err != nil {
		sess.Close()
		return nil, fmt.Errorf("starting agent session: %w", unavailable(err))
	}
	c := &Client{sess: sess}
	ctx, cancel := context.WithTimeout(context.Background(), helloTimeout)
	defer cancel()
	resp, err := c.roundTrip(ctx, agentproto.Request{
		Op:    agentproto.OpHello,
		Hello: &agentproto.Hello{Version: agentproto.ProtocolVersion},
	})
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("agent handshake: %w", err)
	}
	if resp.Hello == nil || resp.Hello.Version != agentproto.ProtocolVersion {
		// (checkResponse checked the rest of it.)
		c.Close()
		v := 0
		if resp.Hello != nil {
			v = resp.Hello.Version
		}
		return nil, errdefs.Wrap(errdefs.ErrUnavailable, "agent speaks protocol %d, want %d", v, agentproto.ProtocolVersion)
	}
	c.agent = *resp.Hello
	if o.dial != nil && slices.Contains(c.agent.Features, agentproto.FeatureDirect) {
		c.direct = o.dial
	}
	return c, nil
}

// Agent returns what the agent said about itself in the handshake.
func (c *Client) Agent() agentproto.Hello { return c.agent }

// Done is closed when the session ends (Close, or the connection dropped).
func (c *Client) Done() <-chan struct{} { return c.sess.CloseChan() }

// Close ends the session and closes the connection. Running execs continue
// in the agent.
func (c *Client) Close() error {
	c.closeOnce.Do(func() { c.closeErr = c.sess.Close() })
	return c.closeErr
}

// Ping checks that the agent answers.
func (c *Client) Ping(ctx context.Context) error {
	_, err := c.roundTrip(ctx, agentproto.Request{Op: agentproto.OpPing})
	return err
}

// Exec starts a process and returns its event stream, attached from offset 0.
// A process that cannot start (no such binary, bad cwd, unknown user) is not an
// error here: its stream ends with an exit event of status "error". Cancelling
// ctx releases the stream; the process keeps running.
func (c *Client) Exec(ctx context.Context, req agentproto.ExecRequest) (*Stream, error) {
	cl, err := c.start(ctx, agentproto.Request{Op: agentproto.OpExec, Exec: &req})
	if err != nil {
		return nil, err
	}
	return &Stream{cl: cl, id: req.ID}, nil
}

// Attach follows the output of a running or finished exec from fromOffset on.
func (c *Client) Attach(ctx context.Context, execID string, fromOffset int64) (*Stream, error) {
	cl, err := c.start(ctx, agentproto.Request{Op: agentproto.OpAttach, ExecID: execID, FromOffset: fromOffset})
	if err != nil {
		return nil, err
	}
	return &Stream{cl: cl, id: execID, next: max(fromOffset, 0)}, nil
}

// Wait blocks until the exec ends and returns its result.
func (c *Client) Wait(ctx context.Context, execID string) (agentproto.ExecResult, error) {
	resp, err := c.roundTrip(ctx, agentproto.Request{Op: agentproto.OpWait, ExecID: execID})
	if err != nil {
		return agentproto.ExecResult{}, err
	}
	if resp.Result == nil {
		return agentproto.ExecResult{}, protocolError("no result for exec %s", execID)
	}
	return *resp.Result, nil
}

// WriteStdin writes data to the exec's stdin; it returns once the process's
// stdin pipe has taken all of it.
func (c *Client) WriteStdin(ctx context.Context, execID string, data []byte) error {
	_, _, err := c.upload(ctx, agentproto.Request{Op: agentproto.OpStdin, ExecID: execID}, bytesReader(data), false)
	return err
}

// CloseStdin closes the exec's stdin (EOF; on a PTY, the EOF character).
func (c *Client) CloseStdin(ctx context.Context, execID string) error {
	_, _, err := c.upload(ctx, agentproto.Request{Op: agentproto.OpStdin, ExecID: execID, EOF: true}, bytesReader(nil), false)
	return err
}

// Signal sends sig ("SIGTERM", "TERM" or "15") to the exec's whole process tree.
func (c *Client) Signal(ctx context.Context, execID string, sig string) error {
	_, err := c.roundTrip(ctx, agentproto.Request{Op: agentproto.OpSignal, ExecID: execID, Signal: sig})
	return err
}

// Resize changes the terminal size of a PTY exec.
func (c *Client) Resize(ctx context.Context, execID string, cols, rows uint16) error {
	_, err := c.roundTrip(ctx, agentproto.Request{Op: agentproto.OpResize, ExecID: execID, Cols: cols, Rows: rows})
	return err
}

// ListExecs returns the running execs and the finished ones the agent still
// keeps, oldest first.
func (c *Client) ListExecs(ctx context.Context) ([]agentproto.ExecInfo, error) {
	resp, err := c.roundTrip(ctx, agentproto.Request{Op: agentproto.OpListExecs})
	if err != nil {
		return nil, err
	}
	return resp.Execs, nil
}

// ReadFile opens path for reading as user ("" means "user"). The caller must
// close the reader; cancelling ctx aborts it.
func (c *Client) ReadFile(ctx context.Context, path, user string) (io.ReadCloser, agentproto.FileInfo, error) {
	return c.readFile(ctx, agentproto.Request{Op: agentproto.OpReadFile, Path: path, User: user})
}

// Download opens path for a download as user ("" means "user"): a file's
// bytes, or a tar stream of a directory, as the returned info's Type says.
// With an agent that lists FeatureReadTar that is one call; with an older
// one a Stat first and then ReadFile or TarOut. A symlink to a directory
// fails as in ReadFile. The caller must close the reader; cancelling ctx
// aborts it.
func (c *Client) Download(ctx context.Context, path, user string) (io.ReadCloser, agentproto.FileInfo, error) {
	if slices.Contains(c.agent.Features, agentproto.FeatureReadTar) {
		rc, fi, err := c.readFile(ctx, agentproto.Request{Op: agentproto.OpReadFile, Path: path, User: user, Tar: true})
		if err == nil && fi.Path == "" {
			// Whether the data is a tar stream is in the info.
			rc.Close()
			return nil, agentproto.FileInfo{}, protocolError("read_file of %s: no file info", clip(path, maxPath))
		}
		return rc, fi, err
	}
	st, err := c.Stat(ctx, path, user)
	if err != nil {
		return nil, agentproto.FileInfo{}, err
	}
	if st.Type == agentproto.FileTypeDir {
		rc, err := c.TarOut(ctx, path, user)
		return rc, st, err
	}
	rc, fi, err := c.ReadFile(ctx, path, user)
	if fi.Path == "" {
		fi = st
	}
	return rc, fi, err
}

// readFile starts req, an OpReadFile, and returns its data and the info
// of its Response (zero when it has none).
func (c *Client) readFile(ctx context.Context, req agentproto.Request) (io.ReadCloser, agentproto.FileInfo, error) {
	cl, resp, err := c.startBulk(ctx, req)
	if err != nil {
		return nil, agentproto.FileInfo{}, err
	}
	var fi agentproto.FileInfo
	if resp.File != nil {
		fi = *resp.File
	}
	d := &downloadReader{cl: cl, limit: -1}
	if cl.direct && fi.Type == agentproto.FileTypeFile && fi.Size > 0 {
		// The agent sends exactly this much (see agentproto): more or less
		// is a broken transfer, and more must never reach the caller, who
		// may have announced the size (an HTTP Content-Length).
		d.limit = fi.Size
	}
	return d, fi, nil
}

// WriteFile stores r's bytes at path as user, creating missing parents. Mode 0
// keeps an existing file's mode or uses 0644. With maxBytes > 0 a longer input
// fails with errdefs.ErrTooLarge and leaves no file. It returns the bytes written.
func (c *Client) WriteFile(ctx context.Context, path, user string, mode os.FileMode, r io.Reader, maxBytes int64) (int64, error) {
	return c.WriteFileWithMetadata(ctx, path, user, mode, nil, r, maxBytes)
}

// WriteFileWithMetadata is WriteFile that also gives the file metadata
// (agentproto.Request.Metadata), in place of any it had.
func (c *Client) WriteFileWithMetadata(ctx context.Context, path, user string, mode os.FileMode, md map[string]string, r io.Reader, maxBytes int64) (int64, error) {
	resp, sent, err := c.upload(ctx, agentproto.Request{
		Op: agentproto.OpWriteFile, Path: path, User: user,
		Mode: uint32(mode.Perm()), MaxBytes: maxBytes, Metadata: md,
	}, r, true)
	if err != nil {
		return 0, err
	}
	if resp.Written > sent {
		return 0, protocolError("wrote %d bytes of %d sent", resp.Written, sent)
	}
	return resp.Written, nil
}

// Stat describes path (a symlink itself, not its target).
func (c *Client) Stat(ctx context.Context, path, user string) (agentproto.FileInfo, error) {
	resp, err := c.roundTrip(ctx, agentproto.Request{Op: agentproto.OpStat, Path: path, User: user})
	if err != nil {
		return agentproto.FileInfo{}, err
	}
	if resp.File == nil {
		return agentproto.FileInfo{}, protocolError("no file info for %s", path)
	}
	return *resp.File, nil
}

// List returns the entries below directory path down to depth levels (1: the
// directory's own entries), sorted by path. Symlinked directories are not
// followed.
func (c *Client) List(ctx context.Context, path, user string, depth int) ([]agentproto.FileInfo, error) {
	resp, err := c.roundTrip(ctx, agentproto.Request{Op: agentproto.OpList, Path: path, User: user, Depth: depth})
	if err != nil {
		return nil, err
	}
	return resp.Files, nil
}

// Mkdir creates directory path; with parents, missing parents too and an
// existing directory is not an error.
func (c *Client) Mkdir(ctx context.Context, path, user string, parents bool) error {
	_, err := c.roundTrip(ctx, agentproto.Request{Op: agentproto.OpMkdir, Path: path, User: user, Parents: parents})
	return err
}

// Move renames from to to, replacing a file at to.
func (c *Client) Move(ctx context.Context, from, to, user string) error {
	_, err := c.roundTrip(ctx, agentproto.Request{Op: agentproto.OpMove, Path: from, To: to, User: user})
	return err
}

// Remove deletes path; a non-empty directory needs recursive.
func (c *Client) Remove(ctx context.Context, path, user string, recursive bool) error {
	_, err := c.roundTrip(ctx, agentproto.Request{Op: agentproto.OpRemove, Path: path, User: user, Recursive: recursive})
	return err
}

// TarOut returns directory path as a tar stream. The caller must close it.
func (c *Client) TarOut(ctx context.Context, path, user string) (io.ReadCloser, error) {
	cl, _, err := c.startBulk(ctx, agentproto.Request{Op: agentproto.OpTarOut, Path: path, User: user})
	if err != nil {
		return nil, err
	}
	return &downloadReader{cl: cl, limit: -1}, nil
}

// TarIn unpacks the tar stream r into directory dir (created if missing).
// Entries that would land outside dir are rejected with errdefs.ErrInvalidArgument.
func (c *Client) TarIn(ctx context.Context, dir, user string, r io.Reader) error {
	_, _, err := c.upload(ctx, agentproto.Request{Op: agentproto.OpTarIn, Path: dir, User: user}, r, true)
	return err
}

// Stream is one attachment to an exec's output.
type Stream struct {
	cl   *call
	done bool
	err  error
	// id is the exec; next is the offset output may continue from: no
	// event may go back before it (offsets only grow; a jump is output the
	// agent dropped). What the daemon keeps of an exec's output is bounded
	// by the exec's own cap where it is kept (internal/service/exec).
	id   string
	next int64
}

// Next returns output events in offset order, then one exit event, then io.EOF.
// The event's Data is the caller's to keep. Output that goes back (before
// the offset asked for or an earlier event's end), an exit event that is not
// one, and a stream the agent ends before its exit event (while the session
// lives) are errors wrapping ErrProtocol.
func (s *Stream) Next() (agentproto.Event, error) {
	if s.done {
		return agentproto.Event{}, io.EOF
	}
	if s.err != nil {
		return agentproto.Event{}, s.err
	}
	ev, err := s.next1()
	if err != nil {
		s.err = err
		s.cl.release()
		return agentproto.Event{}, err
	}
	if ev.Type == agentproto.EventExit {
		s.done = true
		s.cl.release()
	}
	return ev, nil
}

// next1 reads and checks the next event.
func (s *Stream) next1() (agentproto.Event, error) {
	t, p, err := s.cl.fr.Next()
	if err != nil {
		if (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)) && s.cl.ctx.Err() == nil && !s.cl.c.sess.IsClosed() {
			return agentproto.Event{}, protocolError("the stream of exec %s ended without its exit event", s.id)
		}
		return agentproto.Event{}, s.cl.fail("reading exec events", err)
	}
	switch t {
	case agentproto.FrameOutput:
		stream, off, data, err := agentproto.DecodeOutput(p)
		if err != nil {
			return agentproto.Event{}, protocolError("exec %s: %v", s.id, err)
		}
		n := int64(len(data))
		switch {
		case off < s.next:
			return agentproto.Event{}, protocolError("exec %s output at offset %d, before %d", s.id, off, s.next)
		case off > math.MaxInt64-n:
			return agentproto.Event{}, protocolError("exec %s output at offset %d, past any log", s.id, off)
		}
		s.next = off + n
		return agentproto.Event{Type: agentproto.EventOutput, Stream: stream, Offset: off, Data: append([]byte(nil), data...)}, nil
	case agentproto.FrameHeader:
		var ev agentproto.Event
		if err := decodeJSON(p, &ev); err != nil {
			return agentproto.Event{}, err
		}
		if ev.Type != agentproto.EventExit || ev.Result == nil {
			return agentproto.Event{}, protocolError("exec %s: an event of type %q in place of its exit", s.id, clip(ev.Type, maxShort))
		}
		if err := checkResult(ev.Result, s.id); err != nil {
			return agentproto.Event{}, err
		}
		ev.Data = nil
		return ev, nil
	default:
		return agentproto.Event{}, protocolError("exec %s: unexpected frame %q in its events", s.id, byte(t))
	}
}

// Close releases the stream; the exec keeps running.
func (s *Stream) Close() error {
	s.cl.release()
	if !s.done && s.err == nil {
		s.err = errors.New("stream closed")
	}
	return nil
}

// stream carries one call: a yamux stream, or a direct connection.
type stream interface {
	io.ReadWriteCloser
	SetDeadline(time.Time) error
	SetWriteDeadline(time.Time) error
}

// call is one request stream.
type call struct {
	c      *Client
	ctx    context.Context
	st     stream
	direct bool // st is a direct connection
	fw     *agentproto.FrameWriter
	fr     *agentproto.FrameReader
	stop   func() bool
	once   sync.Once
}

// open starts a stream for one request and ties it to ctx.
func (c *Client) open(ctx context.Context) (*call, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	st, err := c.sess.OpenStream()
	if err != nil {
		return nil, unavailable(err)
	}
	return c.newCall(ctx, st, agentproto.NewFrameReader(st), false), nil
}

// newCall wraps st, read through fr, as a call tied to ctx.
func (c *Client) newCall(ctx context.Context, st stream, fr *agentproto.FrameReader, direct bool) *call {
	cl := &call{c: c, ctx: ctx, st: st, direct: direct, fw: agentproto.NewFrameWriter(st), fr: fr}
	// Cancellation unblocks any read or write on the stream at once; the
	// caller then sees the context's error (see fail).
	cl.stop = context.AfterFunc(ctx, func() { st.SetDeadline(time.Unix(1, 0)) })
	return cl
}

// openBulk starts a call for a file transfer: on a direct connection when
// the client has them, else on a stream of the session.
func (c *Client) openBulk(ctx context.Context) (*call, error) {
	if c.direct == nil {
		return c.open(ctx)
	}
	conn, err := c.direct(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		// The session may still work (and will say if the agent is gone).
		return c.open(ctx)
	}
	growSendBuffer(conn)
	if _, err := io.WriteString(conn, agentproto.DirectPreamble); err != nil {
		conn.Close()
		return c.open(ctx)
	}
	// Unbuffered: a download's payload stays in the socket for splice.
	return c.newCall(ctx, conn, agentproto.NewFrameReaderUnbuffered(conn), true), nil
}

// release ends the call's stream. Safe to call more than once.
func (cl *call) release() {
	cl.once.Do(func() {
		cl.stop()
		cl.st.Close()
	})
}

// fail turns a stream error into the error a caller sees.
func (cl *call) fail(what string, err error) error {
	if ctxErr := cl.ctx.Err(); ctxErr != nil {
		return fmt.Errorf("%s: %w", what, ctxErr)
	}
	var ae *agentproto.Error
	if errors.As(err, &ae) {
		return agentError(ae)
	}
	return fmt.Errorf("%s: %w", what, unavailable(err))
}

// start sends req and reads the first response; on success the stream stays
// open for what follows.
func (c *Client) start(ctx context.Context, req agentproto.Request) (*call, error) {
	cl, _, err := c.startResp(ctx, req)
	return cl, err
}

// startResp is start that also returns the first response.
func (c *Client) startResp(ctx context.Context, req agentproto.Request) (*call, agentproto.Response, error) {
	cl, err := c.open(ctx)
	if err != nil {
		return nil, agentproto.Response{}, err
	}
	return cl.begin(req)
}

// startBulk is startResp for a file transfer (see openBulk).
func (c *Client) startBulk(ctx context.Context, req agentproto.Request) (*call, agentproto.Response, error) {
	cl, err := c.openBulk(ctx)
	if err != nil {
		return nil, agentproto.Response{}, err
	}
	return cl.begin(req)
}

// begin sends req on the call's stream and reads the first response.
func (cl *call) begin(req agentproto.Request) (*call, agentproto.Response, error) {
	if err := cl.fw.WriteJSON(&req); err != nil {
		cl.release()
		return nil, agentproto.Response{}, cl.fail(string(req.Op), err)
	}
	resp, err := cl.readResponse(&req)
	if err != nil {
		cl.release()
		return nil, agentproto.Response{}, err
	}
	if resp.Error != nil {
		cl.release()
		return nil, agentproto.Response{}, agentError(resp.Error)
	}
	return cl, resp, nil
}

// readResponse reads the agent's answer to req: a header frame holding a
// Response that passes checkResponse.
func (cl *call) readResponse(req *agentproto.Request) (agentproto.Response, error) {
	t, p, err := cl.fr.Next()
	if err != nil {
		return agentproto.Response{}, cl.fail(string(req.Op), err)
	}
	if t != agentproto.FrameHeader {
		return agentproto.Response{}, protocolError("%s: a %q frame in place of the answer", req.Op, byte(t))
	}
	var resp agentproto.Response
	if err := decodeJSON(p, &resp); err != nil {
		return agentproto.Response{}, err
	}
	if err := checkResponse(req, &resp); err != nil {
		return agentproto.Response{}, err
	}
	return resp, nil
}

// roundTrip sends req and returns the single response.
func (c *Client) roundTrip(ctx context.Context, req agentproto.Request) (agentproto.Response, error) {
	cl, resp, err := c.startResp(ctx, req)
	if err != nil {
		return resp, err
	}
	cl.release()
	return resp, nil
}

// upload sends req, waits for the agent to be ready, streams r as data frames
// and returns the final response. The agent may fail the request while data
// is still flowing (too large, disk full); a reader goroutine catches that
// response and stops the writer at once. bulk sends it as a file transfer
// (see openBulk), with full frames; there an *agentproto.SocketBody moves
// from socket to socket by splice (spliceUpload).
//
// sent is the number of bytes sent.
func (c *Client) upload(ctx context.Context, req agentproto.Request, r io.Reader, bulk bool) (_ agentproto.Response, sent int64, _ error) {
	start := c.startResp
	if bulk {
		start = c.startBulk
	}
	cl, _, err := start(ctx, req)
	if err != nil {
		return agentproto.Response{}, 0, err
	}
	defer cl.release()

	type result struct {
		resp agentproto.Response
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := cl.readResponse(&req)
		if err == nil && resp.Error != nil {
			// Stop the writer: the agent no longer reads.
			cl.st.SetWriteDeadline(time.Unix(1, 0))
		}
		done <- result{resp, err}
	}()

	var werr error
	spliced := false
	if sb, ok := r.(*agentproto.SocketBody); ok && cl.direct {
		if conn, ok := cl.st.(net.Conn); ok {
			sent, spliced, werr = spliceUpload(cl.fw, conn, sb, agentproto.DirectChunk)
		}
	}
	switch {
	case spliced:
	case cl.direct:
		sent, werr = cl.fw.CopyFrom(r, agentproto.DirectChunk)
	default:
		sent, werr = cl.fw.ReadFrom(r)
	}
	if werr == nil {
		werr = cl.fw.WriteEnd()
	}
	if werr != nil {
		var se *agentproto.SourceError
		if errors.As(werr, &se) {
			// Our reader failed: abort the stream so the agent drops the
			// partial upload, and report the reader's error.
			cl.st.SetDeadline(time.Unix(1, 0))
			<-done
			return agentproto.Response{}, sent, fmt.Errorf("%s: %w", req.Op, se.Err)
		}
	}
	res := <-done
	if res.err != nil {
		return agentproto.Response{}, sent, res.err // readResponse's, final
	}
	if res.resp.Error != nil {
		return agentproto.Response{}, sent, agentError(res.resp.Error)
	}
	if werr != nil {
		return agentproto.Response{}, sent, cl.fail(string(req.Op), werr)
	}
	return res.resp, sent, nil
}

// downloadReader reads the data frames of a download.
type downloadReader struct {
	cl   *call
	buf  []byte
	err  error
	done bool
	// limit is the exact size the agent announced, -1 if none; n counts
	// what arrived.
	limit, n int64
}

// overrun reports whether a frame of k more bytes would pass the limit.
func (d *downloadReader) overrun(k int) bool {
	return d.limit >= 0 && d.n+int64(k) > d.limit
}

// short reports whether the transfer ended before the announced size.
func (d *downloadReader) short() bool { return d.limit >= 0 && d.n < d.limit }

// frameError turns a header frame inside a download into its error.
func frameError(payload []byte) error {
	var resp agentproto.Response
	if err := decodeJSON(payload, &resp); err != nil {
		return err
	}
	if resp.Error != nil {
		return agentError(resp.Error)
	}
	return protocolError("a response without an error inside data")
}

var errOverrun = protocolError("more data than announced")

// WriteTo copies the rest of the download to w. On a direct connection each
// payload goes through io.Copy from the socket itself, which a w backed by
// a socket (net/http's response writer) turns into splice(2).
func (d *downloadReader) WriteTo(w io.Writer) (int64, error) {
	var total int64
	if len(d.buf) > 0 {
		k, err := w.Write(d.buf)
		total += int64(k)
		d.buf = d.buf[k:]
		if err != nil {
			return total, err
		}
	}
	for d.err == nil {
		if !d.cl.direct {
			t, payload, err := d.cl.fr.Next()
			if err != nil {
				d.fail(d.cl.fail("reading data", err))
				break
			}
			if t != agentproto.FrameData {
				d.endFrame(t, payload)
				break
			}
			k, err := w.Write(payload)
			total += int64(k)
			d.n += int64(k)
			if err != nil {
				d.fail(err)
				return total, err
			}
			continue
		}
		t, n, err := d.cl.fr.NextHeader()
		if err != nil {
			d.fail(d.cl.fail("reading data", err))
			break
		}
		if t != agentproto.FrameData {
			var payload []byte
			if n > 0 {
				payload = make([]byte, n)
				if _, err := io.ReadFull(d.cl.fr.Payload(n), payload); err != nil {
					d.fail(d.cl.fail("reading data", err))
					break
				}
			}
			d.endFrame(t, payload)
			break
		}
		if d.overrun(n) {
			d.fail(errOverrun)
			break
		}
		k, err := io.Copy(w, d.cl.fr.Payload(n))
		total += k
		d.n += k
		if err == nil && k < int64(n) {
			err = d.cl.fail("reading data", io.ErrUnexpectedEOF)
		}
		if err != nil {
			// The error may be w's as well as the connection's; a
			// cancelled call says so (fail) rather than "i/o timeout".
			if d.cl.ctx.Err() != nil {
				err = d.cl.fail("reading data", err)
			}
			d.fail(err)
			return total, err
		}
	}
	if d.err == io.EOF {
		return total, nil
	}
	return total, d.err
}

// fail ends the download with err and releases the call.
func (d *downloadReader) fail(err error) {
	d.err = err
	d.cl.release()
}

// endFrame handles a frame other than data: the end, or a failure.
func (d *downloadReader) endFrame(t agentproto.FrameType, payload []byte) {
	switch t {
	case agentproto.FrameEnd:
		if d.short() {
			d.fail(d.cl.fail("reading data", io.ErrUnexpectedEOF))
			return
		}
		d.done = true
		d.fail(io.EOF)
	case agentproto.FrameHeader:
		d.fail(frameError(payload))
	default:
		d.fail(protocolError("unexpected frame %q in data", byte(t)))
	}
}

func (d *downloadReader) Read(p []byte) (int, error) {
	for len(d.buf) == 0 {
		if d.err != nil {
			return 0, d.err
		}
		t, payload, err := d.cl.fr.Next()
		if err != nil {
			d.fail(d.cl.fail("reading data", err))
			return 0, d.err
		}
		if t != agentproto.FrameData {
			d.endFrame(t, payload)
			continue
		}
		if d.overrun(len(payload)) {
			d.fail(errOverrun)
			return 0, d.err
		}
		d.n += int64(len(payload))
		d.buf = payload
	}
	n := copy(p, d.buf)
	d.buf = d.buf[n:]
	return n, nil
}

func (d *downloadReader) Close() error {
	d.cl.release()
	if d.err == nil {
		d.err = errors.New("reader closed")
	}
	return nil
}

// agentError turns an agent's error into an errdefs class with its message,
// cut to maxMessage.
func agentError(e *agentproto.Error) error {
	e = &agentproto.Error{Code: clip(e.Code, maxShort), Message: clip(e.Message, maxMessage)}
	var cls error
	switch e.Code {
	case agentproto.CodeNotFound:
		cls = errdefs.ErrNotFound
	case agentproto.CodeAlreadyExists:
		cls = errdefs.ErrAlreadyExists
	case agentproto.CodeNotADirectory, agentproto.CodeIsADirectory, agentproto.CodeInvalidArgument:
		cls = errdefs.ErrInvalidArgument
	case agentproto.CodePermissionDenied:
		cls = errdefs.ErrPermissionDenied
	case agentproto.CodeNoSpace:
		cls = errdefs.ErrQuotaExceeded
	case agentproto.CodeTooLarge:
		cls = errdefs.ErrTooLarge
	case agentproto.CodeUnsupported:
		cls = errdefs.ErrNotImplemented
	default:
		cls = errdefs.ErrInternal
	}
	return &remoteError{cls: cls, e: *e}
}

// remoteError is an error reported by the agent. It matches its errdefs class
// with errors.Is and its *agentproto.Error with errors.As; but for an
// internal one, the agent's message (safe for the sandbox's user, by the
// protocol) is its *errdefs.Public, which the planes show.
type remoteError struct {
	cls error
	e   agentproto.Error
}

func (r *remoteError) Error() string {
	return r.cls.Error() + ": " + r.e.Message
}

func (r *remoteError) Unwrap() []error {
	if r.cls == errdefs.ErrInternal {
		return []error{r.cls, &r.e}
	}
	return []error{&errdefs.Public{Msg: r.e.Message, Err: r.cls}, &r.e}
}

// unavailable classifies a transport failure.
func unavailable(err error) error {
	return fmt.Errorf("%w: agent connection: %w", errdefs.ErrUnavailable, err)
}

func bytesReader(b []byte) io.Reader {
	return &sliceReader{b: b}
}

// sliceReader is bytes.Reader without the WriteTo method, so that
// FrameWriter.ReadFrom reads it in frame-sized pieces.
type sliceReader struct{ b []byte }

func (s *sliceReader) Read(p []byte) (int, error) {
	if len(s.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p, s.b)
	s.b = s.b[n:]
	return n, nil
}

// directSendBuffer is the send buffer asked for on a direct connection: a
// unix socket's default (about 200 KiB) makes the writer block, and the agent
// wake, five times per data frame.
const directSendBuffer = 4 * agentproto.DirectChunk

// growSendBuffer raises conn's send buffer to directSendBuffer. Root may pass
// the system maximum (SO_SNDBUFFORCE); anyone else gets what SO_SNDBUF
// allows. Best effort: the transfer works either way.
func growSendBuffer(conn net.Conn) {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Control(func(fd uintptr) {
		if unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, directSendBuffer) != nil {
			_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF, directSendBuffer)
		}
	})
}
