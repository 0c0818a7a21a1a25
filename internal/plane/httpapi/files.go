package httpapi

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/service/files"
)

const tarType = "application/x-tar"

// isTar reports whether the request body is a tar archive.
func isTar(r *http.Request) bool {
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	return err == nil && mt == tarType
}

// putFile stores the raw body at ?path= (or unpacks a tar into it). The size
// cap is decided from Content-Length before a byte is read when the client
// sends one, and enforced while reading otherwise.
func (s *Server) putFile(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	q := r.URL.Query()
	max := s.cfg.MaxUploadBytes
	if r.ContentLength > max {
		return errf(errdefs.ErrTooLarge, fmt.Sprintf("upload exceeds the maximum of %d bytes", max))
	}
	var mode os.FileMode
	if v := q.Get("mode"); v != "" {
		n, err := strconv.ParseUint(v, 8, 32)
		if err != nil || n > 0o7777 {
			return errf(errdefs.ErrInvalidArgument, "mode must be octal permission bits such as 0644")
		}
		mode = os.FileMode(n)
	}
	var (
		res api.FileWritten
		err error
	)
	if sb := takeUpload(w, r); sb != nil {
		res, err = s.files.WriteFile(r.Context(), p, r.PathValue("id"), q.Get("path"), q.Get("user"), mode, sb, max)
		if ab, ok := r.Body.(*auditBody); ok {
			ab.n += sb.Consumed()
		}
		if err != nil {
			return err
		}
		logFrom(r.Context()).Debug("file written", "sandbox_id", r.PathValue("id"), "bytes", res.Size, "conn_taken", true)
		writeJSON(w, http.StatusCreated, res)
		return nil
	}
	body := http.MaxBytesReader(w, r.Body, max)
	if isTar(r) {
		res, err = s.files.TarIn(r.Context(), p, r.PathValue("id"), q.Get("path"), q.Get("user"), body)
	} else {
		res, err = s.files.WriteFile(r.Context(), p, r.PathValue("id"), q.Get("path"), q.Get("user"), mode, body, max)
	}
	if err != nil {
		return err
	}
	logFrom(r.Context()).Debug("file written", "sandbox_id", r.PathValue("id"), "bytes", res.Size)
	writeJSON(w, http.StatusCreated, res)
	return nil
}

// getFile sends the file at ?path=, or a directory as a tar stream.
func (s *Server) getFile(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	q := r.URL.Query()
	rc, fi, err := s.files.ReadFile(r.Context(), p, r.PathValue("id"), q.Get("path"), q.Get("user"))
	if err != nil {
		return err
	}
	defer rc.Close()
	h := w.Header()
	name := path.Base(fi.Path)
	if fi.Type == "dir" {
		h.Set("Content-Type", tarType)
		name += ".tar"
	} else {
		h.Set("Content-Type", "application/octet-stream")
		if fi.Type == "file" {
			h.Set("Content-Length", strconv.FormatInt(fi.Size, 10))
		}
	}
	h.Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": name}))
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	if _, err := copyResponse(w, rc); err != nil {
		// The status is sent: abort the connection so the client sees a
		// broken transfer instead of a short file that looks complete.
		logFrom(r.Context()).Warn("file download broke off", "sandbox_id", r.PathValue("id"), "err", err)
		panic(http.ErrAbortHandler)
	}
	return nil
}

func (s *Server) fsList(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	depth, err := queryInt(r, "depth", 1)
	if err != nil {
		return err
	}
	q := r.URL.Query()
	pth := q.Get("path")
	if pth == "" {
		pth = "/"
	}
	out, err := s.files.ListFiles(r.Context(), p, r.PathValue("id"), pth, q.Get("user"), depth)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) fsStat(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	q := r.URL.Query()
	fi, err := s.files.StatFile(r.Context(), p, r.PathValue("id"), q.Get("path"), q.Get("user"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, fi)
	return nil
}

func (s *Server) fsMkdir(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	var req api.MkdirRequest
	if err := decodePathJSON(w, r, &req); err != nil {
		return err
	}
	parents := req.Parents == nil || *req.Parents
	fi, err := s.files.Mkdir(r.Context(), p, r.PathValue("id"), req.Path, req.User, parents)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, fi)
	return nil
}

func (s *Server) fsMove(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	var req api.MoveRequest
	if err := decodePathJSON(w, r, &req); err != nil {
		return err
	}
	fi, err := s.files.Move(r.Context(), p, r.PathValue("id"), req.From, req.To, req.User)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, fi)
	return nil
}

func (s *Server) fsRemove(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	q := r.URL.Query()
	recursive, err := queryBool(r, "recursive")
	if err != nil {
		return err
	}
	if err := s.files.RemoveFile(r.Context(), p, r.PathValue("id"), q.Get("path"), q.Get("user"), recursive); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// decodePathJSON is decodeJSON for a body that names files. A name that is
// not valid UTF-8 cannot be named in JSON, and the decoder would silently
// turn what tries (a raw invalid byte, or an escaped half of a surrogate
// pair such as "\udcff", which is what Python's json.dumps makes of a
// surrogate-escaped file name) into U+FFFD: another name, maybe another
// file. Such a body is refused instead.
func decodePathJSON(w http.ResponseWriter, r *http.Request, dst any) error {
	if r.ContentLength <= maxJSONBody {
		b, err := io.ReadAll(io.LimitReader(r.Body, maxJSONBody+1))
		if err != nil {
			return errf(errdefs.ErrInvalidArgument, "reading the request body failed")
		}
		if !utf8.Valid(b) || hasLoneSurrogate(b) {
			return errf(errdefs.ErrInvalidArgument, "request body holds a string that is not valid UTF-8: file names in the API are UTF-8 (a tar upload carries other names as they are)")
		}
		r.Body = io.NopCloser(bytes.NewReader(b))
	}
	return decodeJSON(w, r, dst, false)
}

// hasLoneSurrogate reports whether JSON text b holds a \u escape of a
// UTF-16 surrogate that is not part of a high-low pair.
func hasLoneSurrogate(b []byte) bool {
	unit := func(i int) (rune, bool) {
		if i+6 > len(b) || b[i] != '\\' || b[i+1] != 'u' {
			return 0, false
		}
		n, err := strconv.ParseUint(string(b[i+2:i+6]), 16, 16)
		return rune(n), err == nil
	}
	for i := 0; i < len(b); i++ {
		if b[i] != '\\' {
			continue
		}
		r, ok := unit(i)
		if !ok {
			i++ // an escape of one character (\\ included): skip it
			continue
		}
		switch {
		case r >= 0xd800 && r < 0xdc00:
			if lo, ok := unit(i + 6); ok && lo >= 0xdc00 && lo < 0xe000 {
				i += 11
				continue
			}
			return true
		case r >= 0xdc00 && r < 0xe000:
			return true
		}
		i += 5
	}
	return false
}

// copyResponse copies r into the response body after WriteHeader. The
// request log's recorder does not pass io.ReaderFrom through, so the writer
// beneath it is used here (the bytes still counted): net/http's ReadFrom
// hands a socket source to splice(2), which moves a download from the
// agent's connection to the client's without copying it through the daemon.
func copyResponse(w http.ResponseWriter, r io.Reader) (int64, error) {
	rec, ok := w.(*statusRecorder)
	if !ok || !rec.wrote {
		return io.Copy(w, r)
	}
	n, err := io.Copy(rec.ResponseWriter, r)
	rec.bytes += n
	return n, err
}

// spliceUploadMin is the smallest upload that takes its connection from
// net/http (takeUpload): below it, the two copies through the daemon cost
// less than a connection that cannot be reused.
const spliceUploadMin = 1 << 20

// takeUpload hijacks the connection of a large plain HTTP/1.1 file upload
// of known length, so that the body can go from the client's socket to the
// agent's by splice(2) instead of through two copies in the daemon (see
// manager.SocketBody). The response, written through w as usual, is then
// sent by the connection's own writer once the request is over, with
// Connection: close. It returns nil, having touched nothing, when the
// request does not qualify or the connection cannot be taken.
func takeUpload(w http.ResponseWriter, r *http.Request) *files.SocketBody {
	rec, ok := w.(*statusRecorder)
	if !ok || rec.wrote || isTar(r) || r.ProtoMajor != 1 || r.TLS != nil || r.ContentLength < spliceUploadMin {
		return nil
	}
	// The original's headers (X-Request-Id…) go in the hijacked response.
	hdr := rec.Header().Clone()
	conn, brw, err := http.NewResponseController(rec.ResponseWriter).Hijack()
	if err != nil {
		return nil
	}
	// net/http read past the headers: those bytes start the body.
	head := make([]byte, min(int64(brw.Reader.Buffered()), r.ContentLength))
	_, _ = io.ReadFull(brw.Reader, head)
	sb := &files.SocketBody{Head: head, Conn: conn, N: r.ContentLength - int64(len(head))}
	if len(head) == 0 && strings.EqualFold(r.Header.Get("Expect"), "100-continue") {
		// net/http would send this on the first read of the body; curl
		// waits for it before sending a large one.
		_, _ = io.WriteString(conn, "HTTP/1.1 100 Continue\r\n\r\n")
	}
	rr := &rawResponse{conn: conn, header: hdr, body: sb}
	rec.ResponseWriter = rr
	// The request's context ends when ServeHTTP has returned, after the
	// error handling and the access log: the response is complete then.
	context.AfterFunc(r.Context(), rr.finish)
	return sb
}

// rawResponseTimeout bounds sending a hijacked upload's response (a few
// hundred bytes) and draining what the client still sends after an early
// error: a client that takes neither in 5 s is not reading, and its
// connection is dropped rather than held.
const rawResponseTimeout = 5 * time.Second

// rawResponse is the http.ResponseWriter of a hijacked upload: it keeps the
// status and body and sends them, as an HTTP/1.1 response that closes the
// connection, when finish is called.
type rawResponse struct {
	conn   net.Conn
	header http.Header
	body   *files.SocketBody

	mu     sync.Mutex
	status int
	buf    bytes.Buffer
	done   bool
}

// Header implements http.ResponseWriter.
func (rr *rawResponse) Header() http.Header { return rr.header }

// WriteHeader implements http.ResponseWriter.
func (rr *rawResponse) WriteHeader(code int) {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	if rr.status == 0 {
		rr.status = code
	}
}

// Write implements http.ResponseWriter; the bytes are sent by finish.
func (rr *rawResponse) Write(b []byte) (int, error) {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	if rr.done {
		return 0, http.ErrHijacked
	}
	if rr.status == 0 {
		rr.status = http.StatusOK
	}
	return rr.buf.Write(b)
}

// finish sends the response and closes the connection. Without a status
// (the handler aborted) the connection is just closed, which the client
// sees as a failed request.
func (rr *rawResponse) finish() {
	rr.mu.Lock()
	rr.done = true
	status, body := rr.status, rr.buf.Bytes()
	rr.mu.Unlock()
	defer rr.conn.Close()
	_ = rr.conn.SetDeadline(time.Now().Add(rawResponseTimeout))
	if status == 0 {
		return
	}
	h := rr.header
	h.Del("Transfer-Encoding")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("Connection", "close")
	if h.Get("Date") == "" {
		h.Set("Date", time.Now().UTC().Format(http.TimeFormat))
	}
	bw := bufio.NewWriter(rr.conn)
	fmt.Fprintf(bw, "HTTP/1.1 %03d %s\r\n", status, http.StatusText(status))
	_ = h.Write(bw)
	_, _ = bw.WriteString("\r\n")
	_, _ = bw.Write(body)
	if bw.Flush() != nil {
		return
	}
	if rr.body.N > 0 || len(rr.body.Head) > 0 {
		// The body was refused part way: closing with unread bytes would
		// reset the connection, and the client could lose the answer.
		// Half-close, and drain until the client closes too.
		if cw, ok := rr.conn.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
		_, _ = io.Copy(io.Discard, rr.conn)
	}
}
