package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"net/url"
	"strconv"
	"time"

	"github.com/airlockhq/airlock/api"
)

// BuildUploads are the files a build sends besides its spec.
type BuildUploads struct {
	// Context is the build context (COPY's sources) as a tar stream.
	Context io.Reader
	// Image is an OCI image tarball (docker save output or an OCI layout as
	// a tar); the spec builds on it with FROM image, or an empty spec
	// imports it as it is.
	Image io.Reader
}

// BuildTemplate starts a template build and returns its id and the version
// it will be. With uploads the request is multipart and streams them; a
// context may instead be set as req.ContextTarB64. Errors in the spec (its
// syntax, FROM) are returned at once as invalid_argument; the rest of the
// build's outcome is followed with FollowTemplateBuild or TemplateBuild.
func (c *Client) BuildTemplate(ctx context.Context, req api.TemplateBuildRequest, uploads BuildUploads, opts ...CallOption) (api.TemplateBuildStarted, error) {
	var out api.TemplateBuildStarted
	if uploads.Context == nil && uploads.Image == nil {
		return out, c.doJSON(ctx, http.MethodPost, "/v1/templates", nil, req, &out, opts...)
	}
	if req.ContextTarB64 != nil && uploads.Context != nil {
		return out, errors.New("give the build context as ContextTarB64 or as an upload, not both")
	}
	spec, err := json.Marshal(req)
	if err != nil {
		return out, fmt.Errorf("encoding request: %w", err)
	}
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	go func() {
		pw.CloseWithError(writeBuildParts(mw, spec, uploads))
	}()
	hreq, err := c.newRequest(ctx, http.MethodPost, "/v1/templates", nil, pr)
	if err != nil {
		pr.Close()
		return out, err
	}
	hreq.Header.Set("Content-Type", mw.FormDataContentType())
	hreq.Header.Set("Accept", "application/json")
	for _, o := range opts {
		o(hreq)
	}
	resp, err := c.send(hreq)
	pr.Close() // stops the writer if the server answered before reading all
	if err != nil {
		return out, err
	}
	defer resp.Body.Close()
	return out, decodeBody(resp, &out)
}

func writeBuildParts(mw *multipart.Writer, spec []byte, uploads BuildUploads) error {
	h := textproto.MIMEHeader{}
	h.Set("Content-Disposition", `form-data; name="spec"`)
	h.Set("Content-Type", "application/json")
	pw, err := mw.CreatePart(h)
	if err != nil {
		return err
	}
	if _, err := pw.Write(spec); err != nil {
		return err
	}
	for _, p := range []struct {
		name string
		r    io.Reader
	}{{"context", uploads.Context}, {"image", uploads.Image}} {
		if p.r == nil {
			continue
		}
		h := textproto.MIMEHeader{}
		h.Set("Content-Disposition", fmt.Sprintf(`form-data; name=%q; filename="%s.tar"`, p.name, p.name))
		h.Set("Content-Type", "application/x-tar")
		w, err := mw.CreatePart(h)
		if err != nil {
			return err
		}
		if _, err := io.Copy(w, p.r); err != nil {
			return fmt.Errorf("sending %s: %w", p.name, err)
		}
	}
	return mw.Close()
}

// ImportImage imports an OCI image tarball as template name (a new version
// if the name exists).
func (c *Client) ImportImage(ctx context.Context, name string, image io.Reader, opts ...CallOption) (api.TemplateBuildStarted, error) {
	return c.BuildTemplate(ctx, api.TemplateBuildRequest{Name: name}, BuildUploads{Image: image}, opts...)
}

// TemplateBuild returns a build's status, error and log.
func (c *Client) TemplateBuild(ctx context.Context, buildID string) (api.TemplateBuild, error) {
	var out api.TemplateBuild
	err := c.doJSON(ctx, http.MethodGet, "/v1/templates/builds/"+url.PathEscape(buildID), nil, nil, &out)
	return out, err
}

// FollowTemplateBuild streams a build's log to w as it happens and returns
// the build once it ended (check its Status: a failed build is not an
// error of this call). A dropped connection is resumed where it stopped.
func (c *Client) FollowTemplateBuild(ctx context.Context, buildID string, w io.Writer) (api.TemplateBuild, error) {
	var (
		offset   int64
		attempts int
	)
	for {
		end, progressed, err := c.followOnce(ctx, buildID, &offset, w)
		if err == nil && end != nil {
			return *end, nil
		}
		if err == nil {
			err = io.ErrUnexpectedEOF // the stream ended without its end event
		}
		var ae *APIError
		if errors.As(err, &ae) || ctx.Err() != nil || !isNetErr(err) && !errors.Is(err, io.ErrUnexpectedEOF) {
			return api.TemplateBuild{}, err
		}
		if progressed {
			attempts = 0
		}
		attempts++
		if attempts > c.resumeAttempts {
			return api.TemplateBuild{}, fmt.Errorf("following build %s: %w", buildID, err)
		}
		select {
		case <-time.After(c.resumeBackoff << (attempts - 1)):
		case <-ctx.Done():
			return api.TemplateBuild{}, ctx.Err()
		}
	}
}

// followOnce reads one connection of a build's event stream.
func (c *Client) followOnce(ctx context.Context, buildID string, offset *int64, w io.Writer) (*api.TemplateBuild, bool, error) {
	q := url.Values{}
	if *offset > 0 {
		q.Set("from_offset", strconv.FormatInt(*offset, 10))
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req, err := c.newRequest(ctx, http.MethodGet, "/v1/templates/builds/"+url.PathEscape(buildID), q, nil)
	if err != nil {
		return nil, false, err
	}
	req.Header.Set("Accept", "text/event-stream")
	resp, err := c.send(req)
	if err != nil {
		return nil, false, err
	}
	defer resp.Body.Close()
	if !isEventStream(resp.Header.Get("Content-Type")) {
		return nil, false, fmt.Errorf("build %s: the server did not answer with an event stream", buildID)
	}
	// The server sends a heartbeat at least every 15 s: silence beyond the
	// idle timeout is a dead connection.
	idle := time.AfterFunc(c.streamIdle, cancel)
	defer idle.Stop()
	sr := newSSEReader(resp.Body, func() { idle.Reset(c.streamIdle) })
	progressed := false
	for {
		ev, err := sr.next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return nil, progressed, err
		}
		switch ev.Event {
		case "log":
			var le api.TemplateLogEvent
			if err := json.Unmarshal([]byte(ev.Data), &le); err != nil {
				return nil, progressed, fmt.Errorf("decoding build log event: %w", err)
			}
			// The SSE id is the offset after the chunk in the raw log (the
			// data may have had invalid UTF-8 replaced).
			end := le.Offset + int64(len(le.Data))
			if n, err := strconv.ParseInt(ev.ID, 10, 64); err == nil {
				end = n
			}
			if end > *offset {
				// Skip what an earlier connection already delivered.
				data := le.Data
				if le.Offset < *offset {
					data = data[min(int64(len(data)), *offset-le.Offset):]
				}
				if _, err := io.WriteString(w, data); err != nil {
					return nil, progressed, err
				}
				*offset = end
				progressed = true
			}
		case "end":
			var b api.TemplateBuild
			if err := json.Unmarshal([]byte(ev.Data), &b); err != nil {
				return nil, progressed, fmt.Errorf("decoding build end event: %w", err)
			}
			return &b, progressed, nil
		}
	}
}

// ListTemplates lists the templates the key's tenant can use.
func (c *Client) ListTemplates(ctx context.Context) (api.TemplateList, error) {
	var out api.TemplateList
	err := c.doJSON(ctx, http.MethodGet, "/v1/templates", nil, nil, &out)
	return out, err
}

// GetTemplate returns template ref ("name" for the newest version, or
// "name@N").
func (c *Client) GetTemplate(ctx context.Context, ref string) (api.Template, error) {
	var out api.Template
	err := c.doJSON(ctx, http.MethodGet, "/v1/templates/"+url.PathEscape(ref), nil, nil, &out)
	return out, err
}

// DeleteTemplate deletes template ref ("name": every version, "name@N": one).
// Sandboxes that use a deleted version keep running.
func (c *Client) DeleteTemplate(ctx context.Context, ref string) error {
	return c.doJSON(ctx, http.MethodDelete, "/v1/templates/"+url.PathEscape(ref), nil, nil, nil)
}
