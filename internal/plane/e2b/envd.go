package e2b

import (
	"compress/gzip"
	"context"
	"encoding/base64"
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"net"
	"net/http"
	"net/http/httputil"
	"path"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/plane/e2b/envd/filesystempb/filesystempbconnect"
	"github.com/airlockhq/airlock/internal/plane/e2b/envd/processpb/processpbconnect"
	"github.com/airlockhq/airlock/internal/service/sandbox"
)

// maxRPCBytes bounds one Connect message.
const maxRPCBytes = 16 << 20

// target is the sandbox a sandbox-plane request addresses, once its token
// checked out.
type target struct {
	id string
	p  auth.Principal
}

type targetKey struct{}

func targetFrom(ctx context.Context) target {
	t, _ := ctx.Value(targetKey{}).(target)
	return t
}

// serveSandbox authenticates a sandbox-plane request and routes it by port.
//
// Every request needs a credential of the sandbox it names, checked before
// anything else is looked at: its envd access token (X-Access-Token, or
// E2B-Traffic-Access-Token as E2B accepts for ports), or, for any port but
// envd's, its traffic access token (E2B-Traffic-Access-Token, which
// @e2b/code-interpreter sends on its /contexts calls). Whatever the sandbox
// id names (nothing, another tenant's sandbox, a gone one), a request
// without such a credential gets the same 401, after the same delay.
func (h *Handler) serveSandbox(w http.ResponseWriter, r *http.Request) {
	id := r.Header.Get(HeaderSandboxID)
	port, portOK := EnvdPort, true
	if v := r.Header.Get(HeaderSandboxPort); v != "" {
		n, err := strconv.Atoi(v)
		port, portOK = n, err == nil && n >= 1 && n <= 65535
	}
	if !h.sandboxAuthorized(r, id, port) {
		err := errf(errdefs.ErrUnauthenticated, "missing or invalid access token")
		h.authFailed(r, err, "sandbox plane")
		h.writeError(w, r, err)
		return
	}
	if !portOK {
		h.writeError(w, r, errf(errdefs.ErrInvalidArgument, "invalid %s header", HeaderSandboxPort))
		return
	}
	p, sb, err := h.sandboxPrincipal(r.Context(), id)
	if err == nil && sb.State != api.StateRunning {
		err = errf(errdefs.ErrNotFound, "sandbox %q is %s", id, sb.State)
	}
	if err != nil {
		if errdefs.IsNotFound(err) {
			// What E2B's proxy answers for a sandbox that is gone; the SDKs
			// turn it into "sandbox timed out / not running". Only a
			// holder of the sandbox's token gets this far.
			h.log.Debug("e2b sandbox not running", "sandbox_id", id, "err", err)
			writeJSON(w, http.StatusBadGateway, errorBody{Code: http.StatusBadGateway, Message: "sandbox " + strconv.Quote(id) + " is not running"})
			return
		}
		h.writeError(w, r, err)
		return
	}
	r = r.WithContext(context.WithValue(r.Context(), targetKey{}, target{id: id, p: p}))
	switch port {
	case EnvdPort:
		h.envd.ServeHTTP(w, r)
	case JupyterPort:
		h.code.ServeHTTP(w, r)
	default:
		h.proxyPort(w, r, id, p, port)
	}
}

// sandboxAuthorized reports whether r carries a credential of sandbox id
// for port (see serveSandbox). It does the same work whatever id names.
func (h *Handler) sandboxAuthorized(r *http.Request, id string, port int) bool {
	envdTok := r.Header.Get(HeaderAccessToken)
	traffic := r.Header.Get(HeaderTrafficToken)
	ok := h.validToken(id, envdTok)
	ok = h.validToken(id, traffic) || ok
	ok = h.validTrafficToken(id, traffic) && port != EnvdPort || ok
	return ok && id != ""
}

func (h *Handler) envdMux() http.Handler {
	mux := http.NewServeMux()
	// RPC messages are small (commands, paths, stdin chunks); file bodies
	// go through /files.
	limit := connect.WithReadMaxBytes(maxRPCBytes)
	mux.Handle(processpbconnect.NewProcessHandler(&processService{h: h}, limit))
	mux.Handle(filesystempbconnect.NewFilesystemHandler(&filesystemService{h: h}, limit))
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	mux.HandleFunc("GET /files", h.getFile)
	mux.HandleFunc("POST /files", h.postFile)
	mux.HandleFunc("GET /envs", func(w http.ResponseWriter, r *http.Request) {
		// The sandbox's environment holds secrets: not served.
		writeJSON(w, http.StatusOK, map[string]string{})
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		h.writeError(w, r, errf(errdefs.ErrNotFound, "airlock does not serve %s %s of envd", r.Method, r.URL.Path))
	})
	return mux
}

// userOf returns the user an envd RPC acts as: `Authorization: Basic
// base64("<user>:")`, else the sandbox's default user.
func userOf(hdr http.Header) string {
	a := hdr.Get("Authorization")
	scheme, rest, ok := strings.Cut(a, " ")
	if !ok || !strings.EqualFold(scheme, "Basic") {
		return sandbox.DefaultUser
	}
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(rest))
	if err != nil {
		return sandbox.DefaultUser
	}
	user, _, _ := strings.Cut(string(b), ":")
	if user == "" {
		return sandbox.DefaultUser
	}
	return user
}

// homeOf is where envd resolves relative paths for user.
func homeOf(user string) string {
	if user == "root" {
		return "/root"
	}
	return "/home/" + user
}

// resolvePath makes p absolute (relative to user's home, as envd does) and
// clean, so that `a/../b` works as it does in E2B. Cleaning an absolute path
// cannot climb above /, and the agent resolves it in the sandbox's root.
func resolvePath(p, user string) (string, error) {
	if p == "" {
		return "", errf(errdefs.ErrInvalidArgument, "path is required")
	}
	if strings.HasPrefix(p, "~/") || p == "~" {
		p = homeOf(user) + strings.TrimPrefix(p, "~")
	}
	if !strings.HasPrefix(p, "/") {
		p = homeOf(user) + "/" + p
	}
	return path.Clean(p), nil
}

// fileUser is the user of a /files call (?username=).
func fileUser(r *http.Request) string {
	if u := r.URL.Query().Get("username"); u != "" {
		return u
	}
	return sandbox.DefaultUser
}

func (h *Handler) getFile(w http.ResponseWriter, r *http.Request) {
	t := targetFrom(r.Context())
	user := fileUser(r)
	p, err := resolvePath(r.URL.Query().Get("path"), user)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	rc, fi, err := h.files.ReadFile(r.Context(), t.p, t.id, p, user)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	defer rc.Close()
	if fi.Type == "dir" {
		h.writeError(w, r, errf(errdefs.ErrInvalidArgument, "path %q is a directory", p))
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": path.Base(p)}))
	if fi.Size >= 0 && fi.Type == "file" {
		w.Header().Set("Content-Length", strconv.FormatInt(fi.Size, 10))
	}
	w.WriteHeader(http.StatusOK)
	if _, err := io.Copy(w, rc); err != nil {
		h.log.Debug("e2b file download cut short", "sandbox_id", t.id, "err", err)
	}
}

// entryInfo is one item of POST /files' answer.
type entryInfo struct {
	Path     string            `json:"path"`
	Name     string            `json:"name"`
	Type     string            `json:"type"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// metadataHeader starts the headers that carry an upload's file metadata
// (X-Metadata-<key>: <value>, envd 0.6.2).
const metadataHeader = "X-Metadata-"

// uploadMetadata returns an upload's metadata: its X-Metadata-* headers,
// keys lowercased (HTTP header names carry no case), values printable
// ASCII as the SDKs send them.
func uploadMetadata(hdr http.Header) (map[string]string, error) {
	var md map[string]string
	for k, vs := range hdr {
		key, ok := strings.CutPrefix(k, metadataHeader)
		if !ok {
			continue
		}
		if key == "" || len(vs) != 1 {
			return nil, errf(errdefs.ErrInvalidArgument, "invalid metadata header %q", k)
		}
		for _, c := range []byte(vs[0]) {
			if c < 0x20 || c > 0x7e {
				return nil, errf(errdefs.ErrInvalidArgument, "metadata value of %q must be printable ASCII", key)
			}
		}
		if md == nil {
			md = map[string]string{}
		}
		md[strings.ToLower(key)] = vs[0]
	}
	return md, nil
}

func (h *Handler) postFile(w http.ResponseWriter, r *http.Request) {
	t := targetFrom(r.Context())
	user := fileUser(r)
	r.Body = http.MaxBytesReader(w, r.Body, h.cfg.MaxUploadBytes)
	md, err := uploadMetadata(r.Header)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	write := func(p string, body io.Reader) (entryInfo, error) {
		p, err := resolvePath(p, user)
		if err != nil {
			return entryInfo{}, err
		}
		fw, err := h.files.WriteFileWithMetadata(r.Context(), t.p, t.id, p, user, 0, md, body, h.cfg.MaxUploadBytes)
		h.auditFile(r.Context(), t, api.FileAuditDetail{Op: "write", Path: p, User: user, Bytes: fw.Size}, err)
		if err != nil {
			return entryInfo{}, err
		}
		return entryInfo{Path: p, Name: path.Base(p), Type: "file", Metadata: md}, nil
	}
	var out []entryInfo
	ct, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	switch ct {
	case "multipart/form-data":
		mr := multipart.NewReader(r.Body, params["boundary"])
		qpath := r.URL.Query().Get("path")
		for {
			part, err := mr.NextPart()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				h.writeError(w, r, errf(errdefs.ErrInvalidArgument, "invalid multipart body"))
				return
			}
			if part.FormName() != "file" {
				part.Close()
				continue
			}
			// The SDK names each file by its sandbox path in the part's
			// filename; part.FileName() would keep only its base name.
			_, disp, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
			p := disp["filename"]
			if qpath != "" {
				p = qpath
			}
			e, err := write(p, part)
			part.Close()
			if err != nil {
				h.writeError(w, r, err)
				return
			}
			out = append(out, e)
		}
	default:
		var body io.Reader = r.Body
		if strings.EqualFold(r.Header.Get("Content-Encoding"), "gzip") {
			zr, err := gzip.NewReader(r.Body)
			if err != nil {
				h.writeError(w, r, errf(errdefs.ErrInvalidArgument, "invalid gzip body"))
				return
			}
			defer zr.Close()
			body = zr
		}
		e, err := write(r.URL.Query().Get("path"), body)
		if err != nil {
			h.writeError(w, r, err)
			return
		}
		out = append(out, e)
	}
	if len(out) == 0 {
		h.writeError(w, r, errf(errdefs.ErrInvalidArgument, "no file in the request"))
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// proxyPort forwards a request to a port inside the sandbox
// (sandbox.getHost(port) traffic routed by header).
func (h *Handler) proxyPort(w http.ResponseWriter, r *http.Request, id string, p auth.Principal, port int) {
	d := h.ports
	if d == nil {
		writeJSON(w, http.StatusBadGateway, errorBody{Code: http.StatusBadGateway, Message: "this airlock cannot reach sandbox ports"})
		return
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = "http", "sandbox:"+strconv.Itoa(port)
			pr.Out.Host = pr.In.Host
			// Our credentials stay here.
			pr.Out.Header.Del(HeaderAccessToken)
			pr.Out.Header.Del(HeaderTrafficToken)
		},
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return d.DialSandbox(ctx, p, id, port)
			},
			DisableKeepAlives:     true,
			ResponseHeaderTimeout: time.Minute,
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			h.log.Debug("e2b port proxy failed", "sandbox_id", id, "port", port, "err", err)
			writeJSON(w, http.StatusBadGateway, errorBody{Code: http.StatusBadGateway, Message: "nothing answers on port " + strconv.Itoa(port) + " in the sandbox"})
		},
	}
	rp.ServeHTTP(w, r)
}
