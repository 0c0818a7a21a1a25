package server

import (
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"path"
	"strconv"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/errdefs"
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
	body := http.MaxBytesReader(w, r.Body, max)
	var (
		res api.FileWritten
		err error
	)
	if isTar(r) {
		res, err = s.m.TarIn(r.Context(), p, r.PathValue("id"), q.Get("path"), q.Get("user"), body)
	} else {
		res, err = s.m.WriteFile(r.Context(), p, r.PathValue("id"), q.Get("path"), q.Get("user"), mode, body, max)
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
	rc, fi, err := s.m.ReadFile(r.Context(), p, r.PathValue("id"), q.Get("path"), q.Get("user"))
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
	out, err := s.m.ListFiles(r.Context(), p, r.PathValue("id"), pth, q.Get("user"), depth)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) fsStat(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	q := r.URL.Query()
	fi, err := s.m.StatFile(r.Context(), p, r.PathValue("id"), q.Get("path"), q.Get("user"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, fi)
	return nil
}

func (s *Server) fsMkdir(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	var req api.MkdirRequest
	if err := decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	parents := req.Parents == nil || *req.Parents
	fi, err := s.m.Mkdir(r.Context(), p, r.PathValue("id"), req.Path, req.User, parents)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, fi)
	return nil
}

func (s *Server) fsMove(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	var req api.MoveRequest
	if err := decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	fi, err := s.m.Move(r.Context(), p, r.PathValue("id"), req.From, req.To, req.User)
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
	if err := s.m.RemoveFile(r.Context(), p, r.PathValue("id"), q.Get("path"), q.Get("user"), recursive); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
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
