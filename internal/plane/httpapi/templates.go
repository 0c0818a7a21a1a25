package httpapi

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"os"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// maxSpecField bounds a text field of a multipart build request (the spec
// JSON, a dockerfile): specs are kilobytes.
const maxSpecField = 1 << 20

// createTemplate starts a build: a JSON body (the context, if any, as
// context_tar_b64), or multipart/form-data with a `spec` part (the same
// JSON) or name/dockerfile/start_cmd/ready_cmd fields, a `context` part
// (a tar) and an `image` part (an OCI image tarball).
func (s *Server) createTemplate(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	var (
		req                    api.TemplateBuildRequest
		contextPath, imagePath string
		err                    error
	)
	defer func() {
		if err != nil {
			removeIf(contextPath)
			removeIf(imagePath)
		}
	}()
	mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if mt == "multipart/form-data" {
		req, contextPath, imagePath, err = s.readBuildMultipart(w, r)
	} else {
		req, contextPath, err = s.readBuildJSON(w, r)
	}
	if err != nil {
		return err
	}
	started, err := s.templates.BuildTemplate(r.Context(), p, req, contextPath, imagePath)
	if err != nil {
		return err
	}
	w.Header().Set("Location", "/v1/templates/builds/"+started.BuildID)
	writeJSON(w, http.StatusAccepted, started)
	return nil
}

func removeIf(p string) {
	if p != "" {
		os.Remove(p)
	}
}

// readBuildJSON reads a JSON build request; a base64 context goes to an
// upload file.
func (s *Server) readBuildJSON(w http.ResponseWriter, r *http.Request) (api.TemplateBuildRequest, string, error) {
	var req api.TemplateBuildRequest
	// The base64 context makes the body up to 4/3 of the upload limit.
	limit := s.cfg.MaxUploadBytes/3*4 + maxJSONBody
	if r.ContentLength > limit {
		return req, "", errf(errdefs.ErrTooLarge, fmt.Sprintf("request body exceeds %d bytes; send a large context as multipart", limit))
	}
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, _ := mime.ParseMediaType(ct)
		if mt != "application/json" && !strings.HasSuffix(mt, "+json") && mt != "text/plain" && mt != "application/x-www-form-urlencoded" {
			return req, "", errf(errdefs.ErrInvalidArgument, "content-type must be application/json or multipart/form-data")
		}
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, limit))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return req, "", jsonError(err)
	}
	if req.ContextTarB64 == nil || *req.ContextTarB64 == "" {
		return req, "", nil
	}
	f, err := s.templates.TemplateUpload()
	if err != nil {
		return req, "", err
	}
	n, err := io.Copy(f, base64.NewDecoder(base64.StdEncoding, strings.NewReader(*req.ContextTarB64)))
	req.ContextTarB64 = nil
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(f.Name())
		var ce base64.CorruptInputError
		if errors.As(err, &ce) {
			return req, "", errf(errdefs.ErrInvalidArgument, "context_tar_b64 is not valid base64")
		}
		return req, "", err
	}
	if n > s.cfg.MaxUploadBytes {
		os.Remove(f.Name())
		return req, "", errf(errdefs.ErrTooLarge, fmt.Sprintf("build context exceeds %d bytes", s.cfg.MaxUploadBytes))
	}
	return req, f.Name(), nil
}

// readBuildMultipart reads a multipart build request, streaming the
// context and image parts to upload files.
func (s *Server) readBuildMultipart(w http.ResponseWriter, r *http.Request) (req api.TemplateBuildRequest, contextPath, imagePath string, err error) {
	defer func() {
		if err != nil {
			removeIf(contextPath)
			removeIf(imagePath)
			contextPath, imagePath = "", ""
		}
	}()
	body := http.MaxBytesReader(w, r.Body, 2*s.cfg.MaxUploadBytes+maxJSONBody)
	r.Body = body
	mr, err := r.MultipartReader()
	if err != nil {
		return req, "", "", errf(errdefs.ErrInvalidArgument, "malformed multipart body")
	}
	var haveSpec, haveFields bool
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				return req, contextPath, imagePath, err
			}
			return req, contextPath, imagePath, errf(errdefs.ErrInvalidArgument, "malformed multipart body")
		}
		name := part.FormName()
		switch name {
		case "spec":
			b, err := readField(part)
			if err != nil {
				return req, contextPath, imagePath, err
			}
			dec := json.NewDecoder(strings.NewReader(b))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&req); err != nil {
				return req, contextPath, imagePath, jsonError(err)
			}
			if req.ContextTarB64 != nil {
				return req, contextPath, imagePath, errf(errdefs.ErrInvalidArgument, "send the context as the context part, not context_tar_b64, in a multipart request")
			}
			haveSpec = true
		case "name", "dockerfile", "start_cmd", "ready_cmd":
			v, err := readField(part)
			if err != nil {
				return req, contextPath, imagePath, err
			}
			haveFields = true
			switch name {
			case "name":
				req.Name = v
			case "dockerfile":
				req.Dockerfile = v
			case "start_cmd":
				req.StartCmd = &v
			case "ready_cmd":
				req.ReadyCmd = &v
			}
		case "context", "image":
			if (name == "context" && contextPath != "") || (name == "image" && imagePath != "") {
				return req, contextPath, imagePath, errf(errdefs.ErrInvalidArgument, "part "+name+" is given twice")
			}
			p, err := s.savePart(part, name)
			if err != nil {
				return req, contextPath, imagePath, err
			}
			if name == "context" {
				contextPath = p
			} else {
				imagePath = p
			}
		default:
			return req, contextPath, imagePath, errf(errdefs.ErrInvalidArgument, fmt.Sprintf("unknown part %q (want spec, context, image)", truncateText(name, 32)))
		}
	}
	if haveSpec && haveFields {
		return req, contextPath, imagePath, errf(errdefs.ErrInvalidArgument, "give the spec part or the name and dockerfile fields, not both")
	}
	return req, contextPath, imagePath, nil
}

func readField(part *multipart.Part) (string, error) {
	b, err := io.ReadAll(io.LimitReader(part, maxSpecField+1))
	if err != nil {
		return "", errf(errdefs.ErrInvalidArgument, "malformed multipart body")
	}
	if len(b) > maxSpecField {
		return "", errf(errdefs.ErrTooLarge, fmt.Sprintf("part %s exceeds %d bytes", part.FormName(), maxSpecField))
	}
	if !utf8.Valid(b) {
		return "", errf(errdefs.ErrInvalidArgument, "part "+part.FormName()+" is not UTF-8 text")
	}
	return string(b), nil
}

// savePart streams an upload part into an upload file.
func (s *Server) savePart(part *multipart.Part, name string) (string, error) {
	f, err := s.templates.TemplateUpload()
	if err != nil {
		return "", err
	}
	n, err := io.Copy(f, io.LimitReader(part, s.cfg.MaxUploadBytes+1))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && n > s.cfg.MaxUploadBytes {
		err = errf(errdefs.ErrTooLarge, fmt.Sprintf("part %s exceeds %d bytes", name, s.cfg.MaxUploadBytes))
	}
	if err != nil {
		os.Remove(f.Name())
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) || errdefs.IsInvalidArgument(err) || errors.Is(err, errdefs.ErrTooLarge) {
			return "", err
		}
		return "", errf(errdefs.ErrInvalidArgument, "reading part "+name+" failed")
	}
	return f.Name(), nil
}

func truncateText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

func (s *Server) listTemplates(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	out, err := s.templates.ListTemplates(r.Context(), p)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) getTemplate(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	t, err := s.templates.GetTemplate(r.Context(), p, r.PathValue("name"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, t)
	return nil
}

func (s *Server) deleteTemplate(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	if err := s.templates.DeleteTemplate(r.Context(), p, r.PathValue("name")); err != nil {
		return err
	}
	logFrom(r.Context()).Info("template deleted", "template", r.PathValue("name"))
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// getTemplateBuild answers a build's status, or with Accept
// text/event-stream streams its log: `log` events from from_offset (or
// Last-Event-ID) on, then one `end` event with the build.
func (s *Server) getTemplateBuild(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	id := r.PathValue("id")
	if !wantsSSE(r) {
		b, err := s.templates.TemplateBuild(r.Context(), p, id)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, b)
		return nil
	}
	from := int64(0)
	v := r.URL.Query().Get("from_offset")
	if v == "" {
		v = r.Header.Get("Last-Event-ID")
	}
	if v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return errf(errdefs.ErrInvalidArgument, "from_offset must be a non-negative integer")
		}
		from = n
	}
	f, err := s.templates.FollowTemplateBuild(r.Context(), p, id, from)
	if err != nil {
		return err
	}
	sw := newSSE(w)
	ctx, cancel := s.streamContext(r)
	defer cancel()
	for {
		data, off, ok, done, err := f.Next(ctx, s.cfg.Heartbeat)
		if err != nil {
			endSSE(ctx, r, sw) // the build goes on
			return nil
		}
		if done {
			b, err := s.templates.TemplateBuild(ctx, p, id)
			if err != nil {
				return nil
			}
			b.Log = ""
			sw.event("end", "", b)
			return nil
		}
		if !ok {
			if err := sw.comment("heartbeat"); err != nil {
				return nil
			}
			continue
		}
		ev := api.TemplateLogEvent{Data: strings.ToValidUTF8(string(data), "\uFFFD"), Offset: off}
		if err := sw.event("log", strconv.FormatInt(off+int64(len(data)), 10), ev); err != nil {
			return nil
		}
	}
}
