package agentclient

import (
	"bytes"
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/lazyregexp"
)

// What an agent says is untrusted: root inside a sandbox can make its own
// agent say anything (it can end it and, in principle, run an impostor under
// gVisor), so the daemon checks every answer against what an honest agent
// can send before a caller sees it. A violation fails the call with an error
// wrapping ErrProtocol and errdefs.ErrUnavailable: the sandbox's agent is not
// usable, and nothing it said is passed on. The bounds are what the agent
// itself never exceeds, with room to spare; each says where that comes from.

// ErrProtocol marks an answer no honest agent gives: a malformed or
// oversized frame, a value out of range, output out of order or past any
// exec's log, a stream the agent ended before its end. Errors wrapping it
// also wrap errdefs.ErrUnavailable.
var ErrProtocol = errors.New("agent broke the protocol")

// protocolError returns an error wrapping errdefs.ErrUnavailable and
// ErrProtocol.
func protocolError(format string, args ...any) error {
	return fmt.Errorf("%w: %w: %s", errdefs.ErrUnavailable, ErrProtocol, fmt.Sprintf(format, args...))
}

// Bounds of what an agent may answer.
const (
	// maxJSONContainers bounds the objects and arrays of one JSON answer.
	// A frame holds at most agentproto.MaxFramePayload (4 MiB), but "{},"
	// decodes into a whole struct: a list of 1.4 million empty entries
	// would take hundreds of MiB of the daemon's memory. The largest honest
	// answer is a listing of maxListEntries entries (one object each) or
	// the execs an agent keeps (two each).
	maxJSONContainers = 64 << 10
	// maxListEntries is what the agent puts in one List answer at most
	// (internal/agent's maxListEntries).
	maxListEntries = 20000
	// maxWatchBatch bounds the events of one watch frame: the agent queues
	// at most agentproto.MaxWatchQueue and then one overflow event.
	maxWatchBatch = 2 * agentproto.MaxWatchQueue
	// maxPath bounds path-like strings (names, paths, link targets):
	// PATH_MAX bytes, each possibly turned into a three-byte U+FFFD.
	maxPath = 3 * 4096
	// maxShort bounds short strings: ids, statuses, signal and feature
	// names, the agent's version.
	maxShort = 256
	// maxMessage is what is kept of an agent's error message or an exec's
	// error text: they reach API answers and stored records.
	maxMessage = 4 << 10
	// maxFeatures bounds the features of the agent's hello.
	maxFeatures = 64
)

// decodeJSON decodes the payload of an agent's header frame into v, after
// checking that it cannot decode into more than maxJSONContainers objects
// and arrays (a byte count: brackets inside strings count too, which only
// errs on the safe side far above any honest answer).
func decodeJSON(p []byte, v any) error {
	if n := bytes.Count(p, []byte{'{'}) + bytes.Count(p, []byte{'['}); n > maxJSONContainers {
		return protocolError("an answer of %d bytes with up to %d objects and arrays, more than %d", len(p), n, maxJSONContainers)
	}
	if err := agentproto.DecodeJSON(p, v); err != nil {
		return protocolError("%v", err)
	}
	return nil
}

// clip cuts s to at most n bytes of valid UTF-8, marking the cut.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s + "…"
}

// checkHello checks the agent's hello.
func checkHello(h *agentproto.Hello) error {
	if len(h.Agent) > maxShort || h.Pid < 0 || len(h.Features) > maxFeatures {
		return protocolError("hello: version %d bytes, pid %d, %d features", len(h.Agent), h.Pid, len(h.Features))
	}
	for _, f := range h.Features {
		if len(f) > maxShort {
			return protocolError("hello: a feature name of %d bytes", len(f))
		}
	}
	return nil
}

// checkFileInfo checks one file description.
func checkFileInfo(fi *agentproto.FileInfo) error {
	switch fi.Type {
	case agentproto.FileTypeFile, agentproto.FileTypeDir, agentproto.FileTypeSymlink, agentproto.FileTypeOther:
	default:
		return protocolError("file type %q", clip(fi.Type, maxShort))
	}
	switch {
	case fi.Size < 0:
		return protocolError("file size %d", fi.Size)
	case fi.Mode&^0o7777 != 0:
		return protocolError("file mode %o", fi.Mode)
	case len(fi.Name) > maxPath || len(fi.Path) > maxPath || len(fi.LinkTarget) > maxPath:
		return protocolError("file name, path or link target longer than %d bytes", maxPath)
	}
	return nil
}

// finalStatus reports whether s is a status an ended exec may have.
func finalStatus(s string) bool {
	switch s {
	case agentproto.StatusExited, agentproto.StatusTimeout, agentproto.StatusKilled, agentproto.StatusOOM, agentproto.StatusError:
		return true
	}
	return false
}

// validSignal matches a signal's name as the agent reports it ("SIGKILL",
// "SIGRTMIN+3").
var validSignal = lazyregexp.New(`^SIG[A-Z0-9+-]{1,12}$`)

// checkResult checks an exec's result and clips its error text. id is the
// exec the result must be about.
func checkResult(r *agentproto.ExecResult, id string) error {
	switch {
	case id != "" && r.ID != id:
		return protocolError("the result of exec %q for exec %q", clip(r.ID, maxShort), id)
	case !finalStatus(r.Status):
		return protocolError("exec %s ended with status %q", id, clip(r.Status, maxShort))
	case r.ExitCode < -1 || r.ExitCode > 255:
		return protocolError("exec %s exit code %d", id, r.ExitCode)
	case r.Signal != "" && !validSignal.MatchString(r.Signal):
		return protocolError("exec %s signal %q", id, clip(r.Signal, maxShort))
	case r.StdoutBytes < 0 || r.StderrBytes < 0 || r.DurationMS < 0:
		return protocolError("exec %s counts %d, %d, %d ms", id, r.StdoutBytes, r.StderrBytes, r.DurationMS)
	case len(r.Cwd) > maxPath:
		return protocolError("exec %s cwd longer than %d bytes", id, maxPath)
	}
	r.Error = clip(r.Error, maxMessage)
	return nil
}

// checkExecInfo checks one entry of an exec listing.
func checkExecInfo(e *agentproto.ExecInfo) error {
	switch {
	case len(e.ID) > maxShort || len(e.User) > maxShort || len(e.Cwd) > maxPath:
		return protocolError("exec listing: an id, user or cwd too long")
	case e.Status != agentproto.StatusRunning && !finalStatus(e.Status):
		return protocolError("exec listing: status %q", clip(e.Status, maxShort))
	case e.Pid < 0:
		return protocolError("exec listing: pid %d", e.Pid)
	}
	return nil
}

// checkWatchBatch checks one frame of watch events.
func checkWatchBatch(evs []agentproto.WatchEvent) error {
	if len(evs) > maxWatchBatch {
		return protocolError("%d watch events in one frame, more than %d", len(evs), maxWatchBatch)
	}
	for _, ev := range evs {
		switch ev.Type {
		case agentproto.WatchCreate, agentproto.WatchWrite, agentproto.WatchRemove, agentproto.WatchRename,
			agentproto.WatchChmod, agentproto.WatchOverflow:
		default:
			return protocolError("watch event type %q", clip(ev.Type, maxShort))
		}
		if len(ev.Path) > maxPath || len(ev.From) > maxPath {
			return protocolError("a watch event path longer than %d bytes", maxPath)
		}
	}
	return nil
}

// checkResponse checks the answer to req (an error answer is cut to size
// by agentError).
func checkResponse(req *agentproto.Request, resp *agentproto.Response) error {
	if resp.Error != nil {
		return nil
	}
	if resp.Hello != nil {
		if err := checkHello(resp.Hello); err != nil {
			return err
		}
	}
	if resp.File != nil {
		if err := checkFileInfo(resp.File); err != nil {
			return err
		}
	}
	if len(resp.Files) > maxListEntries {
		return protocolError("a listing of %d entries, more than %d", len(resp.Files), maxListEntries)
	}
	for i := range resp.Files {
		if err := checkFileInfo(&resp.Files[i]); err != nil {
			return err
		}
	}
	for i := range resp.Execs {
		if err := checkExecInfo(&resp.Execs[i]); err != nil {
			return err
		}
	}
	if resp.Written < 0 {
		return protocolError("wrote %d bytes", resp.Written)
	}
	if resp.Result != nil && req.Op == agentproto.OpWait {
		return checkResult(resp.Result, req.ExecID)
	}
	return nil
}
