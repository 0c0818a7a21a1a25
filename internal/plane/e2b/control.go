package e2b

import (
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/service/sandbox"
)

// templateAliases maps E2B's public template names to airlock's. Any other
// name is taken as an airlock template name.
var templateAliases = map[string]string{
	"base":                "base",
	"code-interpreter-v1": "code-interpreter",
}

// e2bTemplateNames is the reverse of templateAliases, for responses.
var e2bTemplateNames = map[string]string{"code-interpreter": "code-interpreter-v1"}

func e2bTemplate(name string) string {
	if n, ok := e2bTemplateNames[name]; ok {
		return n
	}
	return name
}

// newSandboxRequest is the body of POST /sandboxes and /v2/sandboxes (the
// fields airlock honours; the rest are ignored).
type newSandboxRequest struct {
	TemplateID          string            `json:"templateID"`
	Timeout             *int64            `json:"timeout,omitempty"`
	Metadata            map[string]string `json:"metadata,omitempty"`
	EnvVars             map[string]string `json:"envVars,omitempty"`
	AutoPause           bool              `json:"autoPause,omitempty"`
	AutoPauseMemory     *bool             `json:"autoPauseMemory,omitempty"`
	AutoResume          *autoResumeConfig `json:"autoResume,omitempty"`
	AllowInternetAccess *bool             `json:"allow_internet_access,omitempty"`
	Network             *networkConfig    `json:"network,omitempty"`
}

// sandboxResponse is E2B's Sandbox (create, connect, resume).
type sandboxResponse struct {
	TemplateID         string  `json:"templateID"`
	SandboxID          string  `json:"sandboxID"`
	Alias              string  `json:"alias,omitempty"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken"`
	TrafficAccessToken *string `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
}

// sandboxDetail is E2B's SandboxDetail and ListedSandbox.
type sandboxDetail struct {
	TemplateID      string            `json:"templateID"`
	Alias           string            `json:"alias,omitempty"`
	SandboxID       string            `json:"sandboxID"`
	ClientID        string            `json:"clientID"`
	StartedAt       time.Time         `json:"startedAt"`
	EndAt           time.Time         `json:"endAt"`
	CPUCount        int               `json:"cpuCount"`
	MemoryMB        int64             `json:"memoryMB"`
	DiskSizeMB      int64             `json:"diskSizeMB"`
	Metadata        map[string]string `json:"metadata,omitempty"`
	State           string            `json:"state"`
	EnvdVersion     string            `json:"envdVersion"`
	EnvdAccessToken string            `json:"envdAccessToken,omitempty"`
	Domain          *string           `json:"domain"`
	Lifecycle       *lifecycleView    `json:"lifecycle,omitempty"`
}

// sandboxMetric is E2B's SandboxMetric.
type sandboxMetric struct {
	Timestamp     time.Time `json:"timestamp"`
	TimestampUnix int64     `json:"timestampUnix"`
	CPUCount      int       `json:"cpuCount"`
	CPUUsedPct    float64   `json:"cpuUsedPct"`
	MemUsed       uint64    `json:"memUsed"`
	MemTotal      uint64    `json:"memTotal"`
	MemCache      uint64    `json:"memCache"`
	DiskUsed      uint64    `json:"diskUsed"`
	DiskTotal     uint64    `json:"diskTotal"`
}

// clientID is the deprecated, required clientID field: a constant.
const clientID = "airlock"

type controlFunc func(w http.ResponseWriter, r *http.Request, p auth.Principal) error

func (h *Handler) controlMux() http.Handler {
	mux := http.NewServeMux()
	a := func(f controlFunc) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			p, err := h.cfg.Auth.Authenticate(r.Context(), r)
			if err != nil {
				h.authFailed(r, err, "control plane")
				h.writeError(w, r, err)
				return
			}
			r = r.WithContext(auth.WithPrincipal(r.Context(), p))
			if err := f(w, r, p); err != nil {
				h.writeError(w, r, err)
			}
		})
	}
	mux.Handle("POST /sandboxes", a(h.create))
	mux.Handle("POST /v2/sandboxes", a(h.create))
	mux.Handle("GET /sandboxes", a(h.listV1))
	mux.Handle("GET /v2/sandboxes", a(h.list))
	mux.Handle("GET /sandboxes/{id}", a(h.info))
	mux.Handle("DELETE /sandboxes/{id}", a(h.kill))
	mux.Handle("POST /sandboxes/{id}/timeout", a(h.setTimeout))
	mux.Handle("POST /sandboxes/{id}/refreshes", a(h.refresh))
	mux.Handle("POST /sandboxes/{id}/pause", a(h.pause))
	mux.Handle("POST /sandboxes/{id}/resume", a(h.resume))
	mux.Handle("POST /sandboxes/{id}/connect", a(h.connect))
	mux.Handle("POST /v2/sandboxes/{id}/connect", a(h.connect))
	mux.Handle("GET /sandboxes/{id}/metrics", a(h.metrics))
	mux.Handle("PUT /sandboxes/{id}/network", a(h.updateNetwork))
	h.registerDurable(mux, a)
	h.registerTemplates(mux, a)
	mux.Handle("/", a(func(w http.ResponseWriter, r *http.Request, _ auth.Principal) error {
		return errf(errdefs.ErrNotFound, "airlock does not serve %s %s of the e2b api", r.Method, r.URL.Path)
	}))
	return mux
}

// sandboxOf builds E2B's Sandbox for sb.
func (h *Handler) sandboxOf(sb api.Sandbox) sandboxResponse {
	traffic := h.TrafficToken(sb.ID)
	return sandboxResponse{
		TemplateID: e2bTemplate(sb.Template), Alias: e2bTemplate(sb.Template), SandboxID: sb.ID, ClientID: clientID,
		EnvdVersion: EnvdVersion, EnvdAccessToken: h.AccessToken(sb.ID),
		// @e2b/code-interpreter sends it, and nothing else, on its
		// /contexts calls: with it those are authenticated too.
		TrafficAccessToken: &traffic,
	}
}

// detailOf builds E2B's SandboxDetail for sb.
func (h *Handler) detailOf(sb api.Sandbox, withToken bool) sandboxDetail {
	d := sandboxDetail{
		TemplateID: e2bTemplate(sb.Template), Alias: e2bTemplate(sb.Template), SandboxID: sb.ID, ClientID: clientID,
		StartedAt: sb.CreatedAt, EndAt: sb.CreatedAt, CPUCount: int(math.Ceil(sb.Resources.CPU)),
		MemoryMB: sb.Resources.MemoryMB, DiskSizeMB: sb.Resources.DiskMB, Metadata: sb.Metadata,
		State: sb.State, EnvdVersion: EnvdVersion,
	}
	if sb.ExpiresAt != nil {
		d.EndAt = *sb.ExpiresAt
	}
	if withToken {
		d.EnvdAccessToken = h.AccessToken(sb.ID)
	}
	d.Lifecycle = lifecycleViewOf(sb)
	return d
}

func (h *Handler) create(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	var body newSandboxRequest
	if err := decodeJSON(r, &body); err != nil {
		return err
	}
	if body.TemplateID == "" {
		return errf(errdefs.ErrInvalidArgument, "templateID is required")
	}
	req := api.CreateSandboxRequest{
		Env: body.EnvVars, Metadata: body.Metadata, AutoPause: body.AutoPause, TimeoutS: body.Timeout,
	}
	if isSnapshotID(body.TemplateID) {
		// A snapshot (createSnapshot's snapshotID) starts the sandbox.
		req.Snapshot = body.TemplateID
	} else {
		tmpl, err := h.sandboxTemplate(p, body.TemplateID)
		if err != nil {
			return err
		}
		req.Template = tmpl
	}
	lc, err := lifecycleOf(body.AutoPause, body.AutoResume)
	if err != nil {
		return err
	}
	req.Lifecycle = lc
	n, err := policyOf(body.Network, body.AllowInternetAccess)
	if err != nil {
		return err
	}
	req.Network = n
	res, err := h.sandboxes.Create(r.Context(), p, req, r.Header.Get("Idempotency-Key"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, h.sandboxOf(res.Sandbox))
	return nil
}

// e2bStates maps E2B's list states to airlock's.
var e2bStates = map[string][]string{
	"running": {api.StateStarting, api.StateRunning},
	"paused":  {api.StatePaused},
}

func (h *Handler) list(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	q := r.URL.Query()
	f := sandbox.ListFilter{Cursor: q.Get("nextToken")}
	for _, v := range q["state"] {
		for s := range strings.SplitSeq(v, ",") {
			st, ok := e2bStates[strings.TrimSpace(s)]
			if !ok {
				return errf(errdefs.ErrInvalidArgument, "state must be running or paused")
			}
			f.States = append(f.States, st...)
		}
	}
	if len(f.States) == 0 {
		f.States = []string{api.StateStarting, api.StateRunning, api.StatePaused}
	}
	if v := q.Get("metadata"); v != "" {
		mq, err := url.ParseQuery(v)
		if err != nil {
			return errf(errdefs.ErrInvalidArgument, "metadata must be a query string")
		}
		// The SDK URI-encodes each key and value before it builds the
		// query string: one more decoding gives them back.
		f.Metadata = map[string]string{}
		for k := range mq {
			dk, err1 := url.QueryUnescape(k)
			dv, err2 := url.QueryUnescape(mq.Get(k))
			if err1 != nil || err2 != nil {
				return errf(errdefs.ErrInvalidArgument, "metadata must be a query string")
			}
			f.Metadata[dk] = dv
		}
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return errf(errdefs.ErrInvalidArgument, "limit must be a positive integer")
		}
		f.Limit = n
	}
	lf, err := parseListFilters(q)
	if err != nil {
		return err
	}
	var sbs api.SandboxList
	if lf.active() {
		sbs, err = h.listFiltered(r.Context(), p, f, lf)
	} else {
		sbs, err = h.sandboxes.List(r.Context(), p, f)
	}
	if err != nil {
		return err
	}
	out := make([]sandboxDetail, 0, len(sbs.Sandboxes))
	for _, sb := range sbs.Sandboxes {
		out = append(out, h.detailOf(sb, false))
	}
	if sbs.NextCursor != "" {
		w.Header().Set("X-Next-Token", sbs.NextCursor)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// listV1 is the older GET /sandboxes: the running sandboxes.
func (h *Handler) listV1(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	q := r.URL.Query()
	q.Del("state")
	q.Set("state", "running")
	r.URL.RawQuery = q.Encode()
	return h.list(w, r, p)
}

// visible returns sandbox id unless it is stopped: E2B has no stopped
// sandboxes, a killed one is simply gone. A stopped sandbox, another
// tenant's and one that never existed give the same error.
func (h *Handler) visible(r *http.Request, p auth.Principal, id string) (api.Sandbox, error) {
	sb, err := h.sandboxes.Get(r.Context(), p, id)
	if err != nil {
		return api.Sandbox{}, err
	}
	if sb.State == api.StateStopped || sb.State == api.StateStopping {
		return api.Sandbox{}, errf(sandbox.ErrSandboxNotFound, "sandbox not found")
	}
	return sb, nil
}

func (h *Handler) info(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	sb, err := h.visible(r, p, r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, h.detailOf(sb, true))
	return nil
}

func (h *Handler) kill(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	id := r.PathValue("id")
	if _, err := h.visible(r, p, id); err != nil {
		return err
	}
	if err := h.sandboxes.Delete(r.Context(), p, id); err != nil {
		return err
	}
	h.forgetProcs(id)
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// timeoutRequest is the body of …/timeout, …/connect and …/resume.
type timeoutRequest struct {
	Timeout *int64 `json:"timeout,omitempty"`
}

func (h *Handler) setTimeout(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	var body timeoutRequest
	if err := decodeJSON(r, &body); err != nil {
		return err
	}
	if body.Timeout == nil {
		return errf(errdefs.ErrInvalidArgument, "timeout is required")
	}
	if _, err := h.visible(r, p, r.PathValue("id")); err != nil {
		return err
	}
	if _, err := h.sandboxes.SetTimeout(r.Context(), p, r.PathValue("id"), *body.Timeout); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// refresh is the older keep-alive: {duration} seconds more.
func (h *Handler) refresh(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	var body struct {
		Duration *int64 `json:"duration,omitempty"`
	}
	if err := decodeJSON(r, &body); err != nil {
		return err
	}
	if _, err := h.visible(r, p, r.PathValue("id")); err != nil {
		return err
	}
	if body.Duration != nil {
		if _, err := h.sandboxes.SetTimeout(r.Context(), p, r.PathValue("id"), *body.Duration); err != nil {
			return err
		}
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (h *Handler) pause(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	id := r.PathValue("id")
	// memory false (pause({keepMemory: false})) releases the sandbox's
	// RAM: airlock's pause to disk.
	var body struct {
		Memory *bool `json:"memory,omitempty"`
	}
	if err := decodeJSON(r, &body); err != nil {
		return err
	}
	sb, err := h.visible(r, p, id)
	if err != nil {
		return err
	}
	if sb.State == api.StatePaused {
		return errf(errdefs.ErrConflict, "sandbox %q is already paused", id)
	}
	mem := api.PauseMemoryKeep
	if body.Memory != nil && !*body.Memory {
		mem = api.PauseMemoryDisk
	}
	if _, err := h.sandboxes.PauseWith(r.Context(), p, id, sandbox.PauseOptions{Memory: mem}); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (h *Handler) resume(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	id := r.PathValue("id")
	var body timeoutRequest
	if err := decodeJSON(r, &body); err != nil {
		return err
	}
	sb, err := h.visible(r, p, id)
	if err != nil {
		return err
	}
	if sb.State != api.StatePaused {
		return errf(errdefs.ErrConflict, "sandbox %q is not paused", id)
	}
	if sb, err = h.sandboxes.Resume(r.Context(), p, id); err != nil {
		return err
	}
	if body.Timeout != nil {
		if sb, err = h.sandboxes.SetTimeout(r.Context(), p, id, *body.Timeout); err != nil {
			return err
		}
	}
	writeJSON(w, http.StatusCreated, h.sandboxOf(sb))
	return nil
}

// connect returns a running sandbox (200), resuming a paused one (201).
func (h *Handler) connect(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	id := r.PathValue("id")
	var body timeoutRequest
	if err := decodeJSON(r, &body); err != nil {
		return err
	}
	sb, err := h.visible(r, p, id)
	if err != nil {
		return err
	}
	status := http.StatusOK
	if sb.State == api.StatePaused {
		if sb, err = h.sandboxes.Resume(r.Context(), p, id); err != nil {
			return err
		}
		status = http.StatusCreated
	}
	// connect only ever extends a sandbox's life (E2B's API): a timeout
	// that would end it sooner than it ends now leaves it as it is.
	if body.Timeout != nil && (sb.ExpiresAt == nil || time.Now().Add(time.Duration(*body.Timeout)*time.Second).After(*sb.ExpiresAt)) {
		if sb, err = h.sandboxes.SetTimeout(r.Context(), p, id, *body.Timeout); err != nil {
			return err
		}
	}
	writeJSON(w, status, h.sandboxOf(sb))
	return nil
}

func (h *Handler) metrics(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	id := r.PathValue("id")
	sb, err := h.visible(r, p, id)
	if err != nil {
		return err
	}
	// start and end (unix seconds, optional) bound the points: airlock
	// has the current one, stamped to the second as the query is.
	var start, end int64 = 0, math.MaxInt64
	for name, v := range map[string]*int64{"start": &start, "end": &end} {
		if q := r.URL.Query().Get(name); q != "" {
			n, err := strconv.ParseInt(q, 10, 64)
			if err != nil {
				return errf(errdefs.ErrInvalidArgument, "%s must be a unix time in seconds", name)
			}
			*v = n
		}
	}
	out := []sandboxMetric{}
	if now := time.Now().UTC().Truncate(time.Second); sb.State == api.StateRunning && now.Unix() >= start && now.Unix() <= end {
		m, err := h.sandboxes.Metrics(r.Context(), p, id)
		if err != nil {
			return err
		}
		cpus := int(math.Ceil(sb.Resources.CPU))
		pct := 0.0
		if m.UptimeS > 0 && sb.Resources.CPU > 0 {
			// The mean since start: airlock samples cumulative cpu time.
			pct = 100 * m.CPUSeconds / m.UptimeS / sb.Resources.CPU
		}
		out = append(out, sandboxMetric{
			Timestamp: now, TimestampUnix: now.Unix(), CPUCount: cpus, CPUUsedPct: pct,
			MemUsed: m.MemoryBytes, MemTotal: uint64(sb.Resources.MemoryMB) << 20,
			DiskUsed: m.DiskBytes, DiskTotal: uint64(sb.Resources.DiskMB) << 20,
		})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
