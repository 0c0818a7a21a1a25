package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/service/accounting"
)

// authFailed audits a request whose key was missing or wrong and, for a
// wrong key, waits AuthFailureDelay before the answer. The wait holds no
// lock and ends early when the client leaves.
func (s *Server) authFailed(r *http.Request, err error) {
	reason := "invalid api key"
	if errors.Is(err, auth.ErrNoKey) {
		reason = "missing api key"
	} else if !auth.IsUnauthenticated(err) {
		// The store failed, not the client: nothing to audit.
		return
	}
	detail := map[string]string{"reason": reason, "method": r.Method, "route": r.Pattern}
	if host, _, herr := net.SplitHostPort(r.RemoteAddr); herr == nil {
		detail["remote_addr"] = host
	}
	// The display prefix of a key of ours (what key listings show), so that
	// a revoked key still in use can be found; never more of it.
	if k := auth.KeyFromRequest(r); strings.HasPrefix(k, auth.KeyPrefix) && len(k) > len(auth.KeyPrefix)+6 {
		detail["key_prefix"] = k[:len(auth.KeyPrefix)+6]
	}
	s.cfg.Audit.RecordDetail(audit.Event{Type: audit.TypeAuthFailure, RequestID: requestIDFrom(r.Context())}, detail, nil)
	if reason == "missing api key" || s.cfg.AuthFailureDelay <= 0 {
		return
	}
	t := time.NewTimer(s.cfg.AuthFailureDelay)
	defer t.Stop()
	select {
	case <-t.C:
	case <-r.Context().Done():
	}
}

// File operations audited as file_write.
const (
	fileOpWrite  = "write" // PUT …/files (untar with a tar body)
	fileOpMkdir  = "mkdir"
	fileOpMove   = "move"
	fileOpRemove = "remove"
)

// maxAuditedBody is how much of a JSON request body auditFiles keeps to
// read the paths from (mkdir and move bodies are tiny).
const maxAuditedBody = 64 << 10

// auditFiles wraps a file-writing handler: once it answered, the operation
// is recorded with its path, user, size and outcome.
func (s *Server) auditFiles(op string, h handlerFunc) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
		body := &auditBody{ReadCloser: r.Body, keep: op == fileOpMkdir || op == fileOpMove}
		r.Body = body
		err := h(w, r, p)
		q := r.URL.Query()
		d := api.FileAuditDetail{Op: op, Path: q.Get("path"), User: q.Get("user"), OK: err == nil}
		switch op {
		case fileOpWrite:
			d.Bytes = body.n
			if isTar(r) {
				d.Op = "untar"
			}
		case fileOpMkdir:
			var req api.MkdirRequest
			_ = json.Unmarshal(body.buf.Bytes(), &req)
			d.Path, d.User = req.Path, req.User
		case fileOpMove:
			var req api.MoveRequest
			_ = json.Unmarshal(body.buf.Bytes(), &req)
			d.Path, d.To, d.User = req.From, req.To, req.User
		case fileOpRemove:
			d.Recursive, _ = queryBool(r, "recursive")
		}
		if err != nil {
			d.Code = classify(err).Code
		}
		s.files.AuditFileOp(r.Context(), p, r.PathValue("id"), d)
		return err
	}
}

// auditBody counts what a handler reads of a request body and keeps the
// start of it when keep is set.
type auditBody struct {
	io.ReadCloser
	n    int64
	keep bool
	buf  bytes.Buffer
}

func (b *auditBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n += int64(n)
	if b.keep && b.buf.Len() < maxAuditedBody {
		b.buf.Write(p[:min(n, maxAuditedBody-b.buf.Len())])
	}
	return n, err
}

// ndjsonType is the JSON-lines export of the audit trail.
const ndjsonType = "application/x-ndjson"

func wantsNDJSON(r *http.Request) bool {
	for _, part := range strings.Split(r.Header.Get("Accept"), ",") {
		mt, _, err := mime.ParseMediaType(strings.TrimSpace(part))
		if err == nil && mt == ndjsonType {
			return true
		}
	}
	return false
}

// listAudit serves GET /v1/audit: one page as JSON, or with Accept:
// application/x-ndjson every matching event (up to limit), one per line.
func (s *Server) listAudit(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	q := r.URL.Query()
	aq := accounting.AuditQuery{Tenant: q.Get("tenant"), SandboxID: q.Get("sandbox_id"), Cursor: q.Get("cursor")}
	for _, v := range q["type"] {
		for _, t := range strings.Split(v, ",") {
			if t = strings.TrimSpace(t); t != "" {
				aq.Types = append(aq.Types, t)
			}
		}
	}
	var err error
	if aq.Since, err = queryTime(r, "since"); err != nil {
		return err
	}
	if aq.Until, err = queryTime(r, "until"); err != nil {
		return err
	}
	limit, err := queryInt(r, "limit", 0)
	if err != nil {
		return err
	}
	if !wantsNDJSON(r) {
		aq.Limit = limit
		out, err := s.accounting.AuditEvents(r.Context(), p, aq)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, out)
		return nil
	}
	if limit < 0 {
		return errf(errdefs.ErrInvalidArgument, "limit must not be negative")
	}
	// The export pages through the store; the first page's errors are the
	// request's, later ones cut the stream short.
	aq.Limit = accounting.MaxPageSize
	if limit > 0 {
		aq.Limit = min(limit, accounting.MaxPageSize)
	}
	page, err := s.accounting.AuditEvents(r.Context(), p, aq)
	if err != nil {
		return err
	}
	h := w.Header()
	h.Set("Content-Type", ndjsonType)
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	rc := http.NewResponseController(w)
	sent := 0
	for {
		for _, e := range page.Events {
			if err := enc.Encode(e); err != nil {
				return nil // the client left
			}
			sent++
		}
		_ = rc.Flush()
		if !page.HasMore || (limit > 0 && sent >= limit) {
			return nil
		}
		aq.Cursor = page.NextCursor
		if limit > 0 {
			aq.Limit = min(limit-sent, accounting.MaxPageSize)
		}
		if page, err = s.accounting.AuditEvents(r.Context(), p, aq); err != nil {
			logFrom(r.Context()).Warn("audit export broke off", "err", err)
			panic(http.ErrAbortHandler) // a short export must not look complete
		}
	}
}

// queryTime parses an optional RFC 3339 time query parameter.
func queryTime(r *http.Request, name string) (time.Time, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, errf(errdefs.ErrInvalidArgument, name+" must be an RFC 3339 time such as 2026-01-02T15:04:05Z")
	}
	return t, nil
}
