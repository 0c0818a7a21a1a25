package pkgcache

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Registry sets the mirror serves, and the Upstreams key of PyPI's file
// host.
const (
	RegPyPI      = "pypi"
	RegPyPIFiles = "pypi-files"
	RegNPM       = "npm"
	RegGoProxy   = "goproxy"
	RegDebian    = "debian"
)

// Mirror timing and limits.
const (
	// fetchTimeout bounds one upstream download of an artifact: large
	// wheels (hundreds of MB) over a slow link take minutes.
	fetchTimeout = 30 * time.Minute
	// maxRewrite bounds an index page or package document read whole to
	// rewrite its links (npm's biggest packuments are tens of MB).
	maxRewrite = 64 << 20
)

// Reasons of a refused Event.
const (
	ReasonAllowed      = "allowed"
	ReasonCap          = "download_cap"
	ReasonNotAllowed   = "registry_not_allowed"
	ReasonUpstream     = "upstream_error"
	ReasonUpstreamHTTP = "upstream_status"
)

// Event is one package artifact a sandbox fetched (or was refused) through
// the mirror, for the audit trail.
type Event struct {
	SandboxID string `json:"sandbox_id"`
	Registry  string `json:"registry"`
	Package
	// Path is the artifact's path below the registry's prefix.
	Path    string `json:"path"`
	Bytes   int64  `json:"bytes"`
	Cached  bool   `json:"cached"`
	Allowed bool   `json:"allowed"`
	Reason  string `json:"reason"`
	// Status is the HTTP status the sandbox got.
	Status int       `json:"status"`
	Time   time.Time `json:"time"`
}

// Config configures a Mirror.
type Config struct {
	// Store keeps artifacts; nil passes everything through (counted and
	// audited, not cached).
	Store *Store
	// Upstreams maps a registry set (RegPyPI, RegPyPIFiles, RegNPM,
	// RegGoProxy, RegDebian) to its upstream base URL
	// ("https://pypi.org"). A set without one is not served.
	Upstreams map[string]string
	// Client fetches from upstream; default http.DefaultClient. The
	// network package gives one that dials from the host's namespace and
	// refuses private addresses.
	Client *http.Client
	// Audit receives every artifact event; it must not block.
	Audit func(Event)
	// Logger; default slog.Default().
	Logger *slog.Logger
	// Now is the events' clock; default time.Now.
	Now func() time.Time
}

// Mirror is the registry mirror. Handler gives each sandbox its own view.
type Mirror struct {
	cfg Config
	log *slog.Logger
}

// NewMirror returns a mirror.
func NewMirror(cfg Config) *Mirror {
	if cfg.Client == nil {
		cfg.Client = http.DefaultClient
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	up := map[string]string{}
	for k, v := range cfg.Upstreams {
		if v = strings.TrimRight(v, "/"); v != "" {
			up[k] = v
		}
	}
	cfg.Upstreams = up
	return &Mirror{cfg: cfg, log: cfg.Logger}
}

// Serves reports whether the mirror has an upstream for registry set reg.
func (m *Mirror) Serves(reg string) bool { return m.cfg.Upstreams[reg] != "" }

// Sandbox is one sandbox's view of the mirror.
type Sandbox struct {
	ID string
	// Allowed reports whether the sandbox may use registry set reg now
	// (its policy can change while it runs).
	Allowed func(reg string) bool
	// Budget is its download cap; nil for none.
	Budget *Budget
}

// Handler serves sandbox sb: /pypi/simple/…, /pypi/files/…, /npm/…,
// /goproxy/…, /debian/…
func (m *Mirror) Handler(sb Sandbox) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { m.serve(w, r, sb) })
}

func (m *Mirror) serve(w http.ResponseWriter, r *http.Request, sb Sandbox) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		http.Error(w, "airlock package mirror: only GET and HEAD", http.StatusMethodNotAllowed)
		return
	}
	reg, rest, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/")
	rest = "/" + rest
	if reg == RegPyPIFiles || !m.Serves(reg) {
		http.Error(w, fmt.Sprintf("airlock package mirror: no registry %q here", reg), http.StatusNotFound)
		return
	}
	if sb.Allowed != nil && !sb.Allowed(reg) {
		m.emit(sb, Event{Registry: reg, Path: rest, Package: PackageOf(reg, rest), Reason: ReasonNotAllowed, Status: http.StatusForbidden})
		http.Error(w, fmt.Sprintf("airlock package mirror: registry %s is not allowed for this sandbox", reg), http.StatusForbidden)
		return
	}
	m.forward(w, r, sb, reg, rest, m.upstreamURL(reg, rest))
}

// Transparent serves sandbox sb's plain-HTTP requests to host, one of
// registry set reg's hosts, that the egress proxy hands over (apt to a
// Debian mirror): the upstream is host and the path asked for, and
// artifacts are cached as through Handler. A request on the same
// connection naming another host is refused (421): the proxy checked this
// one only.
func (m *Mirror) Transparent(sb Sandbox, reg, host string) http.Handler {
	host = strings.ToLower(host)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			http.Error(w, "airlock package mirror: only GET and HEAD", http.StatusMethodNotAllowed)
			return
		}
		if h := strings.TrimSuffix(strings.ToLower(r.Host), ":80"); strings.TrimSuffix(h, ".") != host {
			http.Error(w, "airlock package mirror: one host per connection", http.StatusMisdirectedRequest)
			return
		}
		if sb.Allowed != nil && !sb.Allowed(reg) {
			http.Error(w, fmt.Sprintf("airlock package mirror: registry %s is not allowed for this sandbox", reg), http.StatusForbidden)
			return
		}
		m.forward(w, r, sb, reg, r.URL.Path, "http://"+host+r.URL.Path)
	})
}

// forward answers a request for rest of registry reg from upstream.
func (m *Mirror) forward(w http.ResponseWriter, r *http.Request, sb Sandbox, reg, rest, upstream string) {
	if sb.Budget.Exhausted() {
		m.refuseCap(w, sb, reg, rest)
		return
	}
	if r.URL.RawQuery != "" {
		upstream += "?" + r.URL.RawQuery
	}
	if immutable(reg, rest) {
		m.serveArtifact(w, r, sb, reg, rest, upstream)
		return
	}
	m.passThrough(w, r, sb, reg, upstream)
}

func (m *Mirror) upstreamURL(reg, rest string) string {
	if reg == RegPyPI {
		if files, ok := strings.CutPrefix(rest, "/files/"); ok && m.cfg.Upstreams[RegPyPIFiles] != "" {
			return m.cfg.Upstreams[RegPyPIFiles] + "/" + files
		}
	}
	return m.cfg.Upstreams[reg] + rest
}

func (m *Mirror) refuseCap(w http.ResponseWriter, sb Sandbox, reg, rest string) {
	m.emit(sb, Event{Registry: reg, Path: rest, Package: PackageOf(reg, rest), Reason: ReasonCap, Status: http.StatusInsufficientStorage})
	http.Error(w, fmt.Sprintf("airlock package mirror: this sandbox's download cap of %d MiB is used up", sb.Budget.Limit()>>20), http.StatusInsufficientStorage)
}

func (m *Mirror) emit(sb Sandbox, ev Event) {
	if m.cfg.Audit == nil {
		return
	}
	ev.SandboxID = sb.ID
	ev.Allowed = ev.Reason == ReasonAllowed
	ev.Time = m.cfg.Now()
	m.cfg.Audit(ev)
}

// statusError is an upstream answer other than 200.
type statusError struct{ code int }

func (e statusError) Error() string { return "upstream answered " + strconv.Itoa(e.code) }

// serveArtifact answers an immutable artifact from the store, fetching it
// once (coalesced) when it is not there.
func (m *Mirror) serveArtifact(w http.ResponseWriter, r *http.Request, sb Sandbox, reg, rest, upstream string) {
	ev := Event{Registry: reg, Path: rest, Package: PackageOf(reg, rest)}
	if m.cfg.Store == nil {
		m.passThroughArtifact(w, r, sb, ev, upstream)
		return
	}
	f, size, hit := m.cfg.Store.Open(upstream)
	if !hit {
		// The download runs detached from this request: a client that
		// gives up must not fail the others waiting on the same fetch.
		fctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), fetchTimeout)
		_, err := m.cfg.Store.Fill(fctx, upstream, func(ctx context.Context, dst io.Writer) error {
			return m.fetch(ctx, upstream, dst)
		})
		cancel()
		if err != nil {
			var se statusError
			if errors.As(err, &se) {
				ev.Reason, ev.Status = ReasonUpstreamHTTP, se.code
				m.emit(sb, ev)
				http.Error(w, "airlock package mirror: "+err.Error(), se.code)
				return
			}
			m.log.Warn("package mirror fetch", "sandbox_id", sb.ID, "registry", reg, "err", err)
			ev.Reason, ev.Status = ReasonUpstream, http.StatusBadGateway
			m.emit(sb, ev)
			http.Error(w, "airlock package mirror: fetching upstream failed", http.StatusBadGateway)
			return
		}
		if f, size, hit = m.cfg.Store.Open(upstream); !hit {
			// Larger than the whole cache: served without keeping it.
			m.passThroughArtifact(w, r, sb, ev, upstream)
			return
		}
		hit = false
	}
	defer f.Close()
	ev.Cached = hit
	if !sb.Budget.Fits(size) {
		m.refuseCap(w, sb, reg, rest)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	w.Header().Set("X-Airlock-Cache", map[bool]string{true: "hit", false: "miss"}[hit])
	ev.Status = http.StatusOK
	if r.Method == http.MethodHead {
		w.WriteHeader(http.StatusOK)
		return
	}
	n, err := io.Copy(sb.Budget.Writer(w), f)
	ev.Bytes = n
	ev.Reason = ReasonAllowed
	if errors.Is(err, ErrCapExceeded) {
		ev.Reason = ReasonCap
	}
	m.emit(sb, ev)
}

// fetch downloads upstream into dst; anything but 200 is a statusError.
func (m *Mirror) fetch(ctx context.Context, upstream string, dst io.Writer) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, upstream, nil)
	if err != nil {
		return err
	}
	resp, err := m.cfg.Client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return statusError{resp.StatusCode}
	}
	n, err := io.Copy(dst, resp.Body)
	if err == nil && resp.ContentLength >= 0 && n != resp.ContentLength {
		err = io.ErrUnexpectedEOF
	}
	return err
}

// passThroughArtifact streams an artifact from upstream without keeping it.
func (m *Mirror) passThroughArtifact(w http.ResponseWriter, r *http.Request, sb Sandbox, ev Event, upstream string) {
	resp, err := m.get(r, upstream)
	if err != nil {
		ev.Reason, ev.Status = ReasonUpstream, http.StatusBadGateway
		m.emit(sb, ev)
		http.Error(w, "airlock package mirror: fetching upstream failed", http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK && resp.ContentLength > 0 && !sb.Budget.Fits(resp.ContentLength) {
		m.refuseCap(w, sb, ev.Registry, ev.Path)
		return
	}
	copyHeaders(w.Header(), resp.Header)
	w.WriteHeader(resp.StatusCode)
	ev.Status = resp.StatusCode
	n, err := io.Copy(sb.Budget.Writer(w), resp.Body)
	ev.Bytes, ev.Reason = n, ReasonAllowed
	if resp.StatusCode != http.StatusOK {
		ev.Reason = ReasonUpstreamHTTP
	}
	if errors.Is(err, ErrCapExceeded) {
		ev.Reason = ReasonCap
	}
	m.emit(sb, ev)
}

func (m *Mirror) get(r *http.Request, upstream string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(r.Context(), r.Method, upstream, nil)
	if err != nil {
		return nil, err
	}
	// What package managers negotiate (PEP 691 JSON, npm's abbreviated
	// documents) and revalidation; compression is the transport's.
	for _, h := range []string{"Accept", "If-None-Match", "If-Modified-Since", "User-Agent"} {
		if v := r.Header.Get(h); v != "" {
			req.Header.Set(h, v)
		}
	}
	return m.cfg.Client.Do(req)
}

// passThrough relays an index page or metadata document, rewriting the
// upstream's links in PyPI's and npm's to the mirror.
func (m *Mirror) passThrough(w http.ResponseWriter, r *http.Request, sb Sandbox, reg, upstream string) {
	resp, err := m.get(r, upstream)
	if err != nil {
		m.log.Info("package mirror upstream", "sandbox_id", sb.ID, "registry", reg, "err", err)
		http.Error(w, "airlock package mirror: fetching upstream failed", http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	if (reg == RegPyPI || reg == RegNPM) && resp.StatusCode == http.StatusOK && r.Method == http.MethodGet {
		body, err := io.ReadAll(io.LimitReader(resp.Body, maxRewrite+1))
		if err != nil || len(body) > maxRewrite {
			http.Error(w, "airlock package mirror: index too large or cut", http.StatusBadGateway)
			return
		}
		body = m.rewrite(reg, "http://"+r.Host, body)
		copyHeaders(w.Header(), resp.Header)
		w.Header().Del("ETag") // the body changed
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.WriteHeader(http.StatusOK)
		_, _ = sb.Budget.Writer(w).Write(body)
		return
	}
	copyHeaders(w.Header(), resp.Header)
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(sb.Budget.Writer(w), resp.Body)
}

// rewrite points the upstream's absolute links at the mirror (base is
// "http://<the host the sandbox asked>").
func (m *Mirror) rewrite(reg, base string, body []byte) []byte {
	type pair struct{ from, to string }
	var pairs []pair
	switch reg {
	case RegPyPI:
		if f := m.cfg.Upstreams[RegPyPIFiles]; f != "" {
			pairs = append(pairs, pair{f + "/", base + "/pypi/files/"})
		}
		pairs = append(pairs, pair{m.cfg.Upstreams[RegPyPI] + "/", base + "/pypi/"})
	case RegNPM:
		pairs = append(pairs, pair{m.cfg.Upstreams[RegNPM] + "/", base + "/npm/"})
	}
	for _, p := range pairs {
		body = bytes.ReplaceAll(body, []byte(p.from), []byte(p.to))
		// JSON may escape the slashes.
		body = bytes.ReplaceAll(body, []byte(strings.ReplaceAll(p.from, "/", `\/`)), []byte(strings.ReplaceAll(p.to, "/", `\/`)))
	}
	return body
}

var relayedHeaders = []string{"Content-Type", "Content-Length", "Last-Modified", "ETag", "Cache-Control", "Content-Encoding"}

func copyHeaders(dst, src http.Header) {
	for _, h := range relayedHeaders {
		if v := src.Values(h); len(v) > 0 {
			dst[h] = slices.Clone(v)
		}
	}
}
