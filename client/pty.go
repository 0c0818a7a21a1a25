package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/coder/websocket"

	"github.com/airlockhq/airlock/api"
)

// ptyReadLimit bounds one WebSocket message from the server. Terminal output
// comes in reads of a few KiB; the bound keeps a broken server from making
// the client buffer without limit.
const ptyReadLimit = 4 << 20

// PTYOptions say what to run on a terminal.
type PTYOptions struct {
	Cols, Rows uint16   // initial size; 0 means the server default (80x24)
	Cmd        []string // argv to run; empty means the user's login shell
	User       string   // "" means the server default ("user")
	Cwd        string   // "" means the user's home
}

// PTY is an interactive terminal session in a sandbox over a WebSocket.
// Read and Write may be used from different goroutines; Resize and Close
// are safe at any time.
type PTY struct {
	conn   *websocket.Conn
	ctx    context.Context
	cancel context.CancelFunc

	rmu sync.Mutex // one reader at a time
	cur io.Reader  // the binary message being read

	emu  sync.Mutex
	exit *api.ExecResult

	closed atomic.Bool // Close was called: errors from then on are io.EOF
}

// ptyControl is a text frame from the server: the outcome of the terminal's
// process, sent before it closes the connection.
type ptyControl struct {
	Exit *api.ExecResult `json:"exit,omitempty"`
}

// PTY opens a terminal running opts.Cmd in the sandbox.
func (c *Client) PTY(ctx context.Context, sandboxID string, opts PTYOptions) (*PTY, error) {
	u := c.endpoint(sandboxPath(sandboxID, "pty"))
	q := url.Values{}
	if opts.Cols > 0 {
		q.Set("cols", strconv.Itoa(int(opts.Cols)))
	}
	if opts.Rows > 0 {
		q.Set("rows", strconv.Itoa(int(opts.Rows)))
	}
	for _, a := range opts.Cmd {
		q.Add("cmd", a)
	}
	if opts.User != "" {
		q.Set("user", opts.User)
	}
	if opts.Cwd != "" {
		q.Set("cwd", opts.Cwd)
	}
	u.RawQuery = q.Encode()
	h := http.Header{}
	c.authorize(h)
	conn, resp, err := websocket.Dial(ctx, u.String(), &websocket.DialOptions{HTTPClient: c.hc, HTTPHeader: h})
	if err != nil {
		if resp != nil && resp.StatusCode >= 300 {
			return nil, decodeError(resp)
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("opening pty: %w", context.Cause(ctx))
		}
		return nil, &TransportError{Method: http.MethodGet, URL: redactURL(&u), Err: err}
	}
	conn.SetReadLimit(ptyReadLimit)
	pctx, cancel := context.WithCancel(context.Background())
	return &PTY{conn: conn, ctx: pctx, cancel: cancel}, nil
}

// Read reads terminal output. It returns io.EOF once the server ended the
// session normally (the process exited; see ExitResult).
func (p *PTY) Read(b []byte) (int, error) {
	p.rmu.Lock()
	defer p.rmu.Unlock()
	for {
		if p.cur != nil {
			n, err := p.cur.Read(b)
			if err == io.EOF {
				p.cur = nil
				if n > 0 {
					return n, nil
				}
				continue
			}
			return n, err
		}
		typ, r, err := p.conn.Reader(p.ctx)
		if err != nil {
			return 0, p.readErr(err)
		}
		if typ == websocket.MessageText {
			var ctl ptyControl
			raw, err := io.ReadAll(r)
			if err != nil {
				return 0, p.readErr(err)
			}
			if json.Unmarshal(raw, &ctl) == nil && ctl.Exit != nil {
				p.emu.Lock()
				p.exit = ctl.Exit
				p.emu.Unlock()
			}
			continue
		}
		p.cur = r
	}
}

func (p *PTY) readErr(err error) error {
	switch websocket.CloseStatus(err) {
	case websocket.StatusNormalClosure, websocket.StatusGoingAway:
		return io.EOF
	}
	if p.closed.Load() {
		return io.EOF // closed by us
	}
	return fmt.Errorf("pty: %w", err)
}

// Write sends keystrokes (raw bytes) to the terminal.
func (p *PTY) Write(b []byte) (int, error) {
	if err := p.conn.Write(p.ctx, websocket.MessageBinary, b); err != nil {
		return 0, fmt.Errorf("pty: %w", err)
	}
	return len(b), nil
}

// Resize changes the terminal's size.
func (p *PTY) Resize(cols, rows uint16) error {
	var m api.PTYResize
	m.Resize.Cols, m.Resize.Rows = cols, rows
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	if err := p.conn.Write(p.ctx, websocket.MessageText, b); err != nil {
		return fmt.Errorf("pty resize: %w", err)
	}
	return nil
}

// ExitResult returns the outcome of the terminal's process once the server
// reported it (after Read returned io.EOF), or nil.
func (p *PTY) ExitResult() *api.ExecResult {
	p.emu.Lock()
	defer p.emu.Unlock()
	return p.exit
}

// Close ends the session; the server then ends the terminal's process.
func (p *PTY) Close() error {
	p.closed.Store(true)
	defer p.cancel()
	err := p.conn.Close(websocket.StatusNormalClosure, "")
	if err == nil || errors.Is(err, net.ErrClosed) || websocket.CloseStatus(err) != -1 {
		return nil // closed already, or the server answered the close
	}
	return fmt.Errorf("closing pty: %w", err)
}
