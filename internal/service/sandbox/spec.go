package sandbox

// This file is a create request checked against the limits and normalised
// into the Spec the record keeps.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"sort"
	"strconv"
	"strings"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/lazyregexp"
)

// knownRuntimes are the runtime names of the API. Asking for one of them
// that this host lacks is runtime_unavailable; any other name is invalid.
var knownRuntimes = []string{"runc", "gvisor", "microvm", "kubernetes"}

var (
	envNameRE     = lazyregexp.New(`^[A-Za-z_][A-Za-z0-9_]{0,255}$`)
	metaKeyRE     = lazyregexp.New(`^[A-Za-z0-9_.\-]{1,128}$`)
	templateRE    = lazyregexp.New(`^([a-z0-9][a-z0-9._-]{0,63})(?:@([0-9]{1,9}))?$`)
	idempotencyRE = lazyregexp.New(`^[\x21-\x7e]{1,255}$`)
)

// Limits on request sizes that config does not cover.
const (
	maxEnvVars      = 256
	maxMetadataKeys = 64
	maxMetaValueLen = 1024
)

// Spec is the normalized create request as stored (secrets excluded).
type Spec struct {
	Template  string            `json:"template"`
	Runtime   string            `json:"runtime"`
	Resources api.Resources     `json:"resources"`
	TimeoutS  int64             `json:"timeout_s"`
	Env       map[string]string `json:"env,omitempty"`
	Secrets   []string          `json:"secret_names,omitempty"`
	// SecretsAsFiles: the secrets are files in /run/secrets, not exec env.
	SecretsAsFiles bool        `json:"secrets_as_files,omitempty"`
	Network        api.Network `json:"network"`
	// NetNS is set when the sandbox joined a namespace of the network
	// backend (every sandbox of a daemon with one); sandboxes of a daemon
	// without it have their runtime's own, which nothing can change.
	NetNS bool `json:"netns,omitempty"`
	// Workdir and User are the template's WORKDIR and USER: the cwd and
	// user of an exec, PTY or code context that names none.
	Workdir string `json:"workdir,omitempty"`
	User    string `json:"user,omitempty"`
}

// execDefaults fills in the user and cwd of an exec that names none: the
// template's USER and WORKDIR (as docker exec does), else the default
// user, whose home the agent picks ("" cwd).
func (sb *Live) execDefaults(user, cwd string) (string, string) {
	if user == "" {
		user = sb.tmplUser
	}
	if user == "" {
		user = agentproto.DefaultUser
	}
	if cwd == "" {
		cwd = sb.tmplWorkdir
	}
	return user, cwd
}

// setExecDefaults takes the template's WORKDIR and USER from the stored
// spec; values that an exec request could not name are ignored.
func (sb *Live) setExecDefaults(sp Spec) {
	if userRE.MatchString(sp.User) {
		sb.tmplUser = sp.User
	}
	if strings.HasPrefix(sp.Workdir, "/") && !strings.ContainsRune(sp.Workdir, 0) {
		sb.tmplWorkdir = sp.Workdir
	}
}

// validateCreate checks req against the limits and fills defaults.
func (m *Service) validateCreate(req api.CreateSandboxRequest) (Spec, driver.Driver, error) {
	s := m.settings
	// A snapshot's defaults are in req already (snapshotDefaults).
	if err := checkPoolFields(req); err != nil {
		return Spec{}, nil, err
	}
	if err := checkLifecycleFields(req.Lifecycle); err != nil {
		return Spec{}, nil, err
	}
	sp := Spec{Template: req.Template, Runtime: req.Runtime, TimeoutS: s.DefaultTimeoutS}
	if sp.Template == "" {
		sp.Template = s.DefaultTemplate
	}
	if sp.Runtime == "" {
		sp.Runtime = s.DefaultRuntime
	}
	// Resources.
	d, mx := s.DefaultResources, s.MaxResources
	sp.Resources = api.Resources{CPU: d.CPU, MemoryMB: d.MemoryMB, DiskMB: d.DiskMB, PIDs: d.PIDs}
	if r := req.Resources; r != nil {
		if r.CPU < 0 || r.MemoryMB < 0 || r.DiskMB < 0 || r.PIDs < 0 {
			return sp, nil, public(errInvalid, "resources must not be negative")
		}
		if r.CPU > 0 {
			if r.CPU < 0.01 {
				return sp, nil, public(errInvalid, "resources.cpu must be at least 0.01")
			}
			sp.Resources.CPU = r.CPU
		}
		if r.MemoryMB > 0 {
			if r.MemoryMB < 16 {
				return sp, nil, public(errInvalid, "resources.memory_mb must be at least 16")
			}
			sp.Resources.MemoryMB = r.MemoryMB
		}
		if r.DiskMB > 0 {
			if r.DiskMB < 16 {
				return sp, nil, public(errInvalid, "resources.disk_mb must be at least 16")
			}
			sp.Resources.DiskMB = r.DiskMB
		}
		if r.PIDs > 0 {
			if r.PIDs < 8 {
				return sp, nil, public(errInvalid, "resources.pids must be at least 8")
			}
			sp.Resources.PIDs = r.PIDs
		}
		sp.Resources.DiskTmpfs = r.DiskTmpfs
	}
	switch {
	case sp.Resources.CPU > mx.CPU:
		return sp, nil, public(errInvalid, "resources.cpu %g exceeds the maximum %g", sp.Resources.CPU, mx.CPU)
	case sp.Resources.MemoryMB > mx.MemoryMB:
		return sp, nil, public(errInvalid, "resources.memory_mb %d exceeds the maximum %d", sp.Resources.MemoryMB, mx.MemoryMB)
	case sp.Resources.DiskMB > mx.DiskMB:
		return sp, nil, public(errInvalid, "resources.disk_mb %d exceeds the maximum %d", sp.Resources.DiskMB, mx.DiskMB)
	case sp.Resources.PIDs > mx.PIDs:
		return sp, nil, public(errInvalid, "resources.pids %d exceeds the maximum %d", sp.Resources.PIDs, mx.PIDs)
	}
	// Timeout.
	if req.TimeoutS != nil {
		t := *req.TimeoutS
		if t < 1 || t > s.MaxTimeoutS {
			return sp, nil, public(errInvalid, "timeout_s must be between 1 and %d", s.MaxTimeoutS)
		}
		sp.TimeoutS = t
	}
	// Env and secrets.
	if len(req.Env)+len(req.Secrets) > maxEnvVars {
		return sp, nil, public(errInvalid, "at most %d env variables and secrets", maxEnvVars)
	}
	size := 0
	for _, kv := range []map[string]string{req.Env, req.Secrets} {
		for k, v := range kv {
			if err := ValidEnv(k, v); err != nil {
				return sp, nil, err
			}
			size += len(k) + len(v)
		}
	}
	if size > s.MaxEnvBytes {
		return sp, nil, public(errInvalid, "env and secrets exceed %d bytes", s.MaxEnvBytes)
	}
	for k := range req.Secrets {
		if req.SecretsAsFiles && !secretFileRE.MatchString(k) {
			return sp, nil, public(errInvalid, "secret name %q is not a valid file name (want %s)", truncate(k, 64), secretFileRE)
		}
		sp.Secrets = append(sp.Secrets, k)
	}
	sp.SecretsAsFiles = req.SecretsAsFiles
	sort.Strings(sp.Secrets)
	sp.Env = req.Env
	// Metadata.
	if len(req.Metadata) > maxMetadataKeys {
		return sp, nil, public(errInvalid, "at most %d metadata keys", maxMetadataKeys)
	}
	size = 0
	for k, v := range req.Metadata {
		if !metaKeyRE.MatchString(k) {
			return sp, nil, public(errInvalid, "metadata key %q must match %s", truncate(k, 64), metaKeyRE)
		}
		if len(v) > maxMetaValueLen {
			return sp, nil, public(errInvalid, "metadata value of %q exceeds %d bytes", k, maxMetaValueLen)
		}
		size += len(k) + len(v)
	}
	if size > s.MaxMetadataBytes {
		return sp, nil, public(errInvalid, "metadata exceeds %d bytes", s.MaxMetadataBytes)
	}
	// Features this version does not have yet: refuse rather than ignore.
	if len(req.Volumes) > 0 {
		return sp, nil, public(errInvalid, "volumes are not supported yet")
	}
	// auto_pause is on_timeout pause under the E2B SDKs' name (its
	// lifecycle is applied by the create: normalizeLifecycle).
	if req.AutoPause && req.Lifecycle != nil && req.Lifecycle.OnTimeout == api.OnTimeoutKill {
		return sp, nil, public(errInvalid, "auto_pause contradicts lifecycle.on_timeout kill")
	}
	if _, _, err := parseTemplateRef(sp.Template); err != nil {
		return sp, nil, err
	}
	// Runtime: a known name the host lacks is unavailable, never a fallback.
	known := false
	for _, k := range knownRuntimes {
		known = known || k == sp.Runtime
	}
	if !known {
		return sp, nil, public(errInvalid, "unknown runtime %q (want one of %s)", truncate(sp.Runtime, 32), strings.Join(knownRuntimes, ", "))
	}
	// Absent (or undetected: not installed, needs root) is permanent, a
	// 400; unhealthy may recover at the next probe, a 503 with Retry-After.
	drv, ok := m.drivers[sp.Runtime]
	if !ok {
		return sp, nil, public(errdefs.ErrRuntimeAbsent, "runtime %s is not available on this host", sp.Runtime)
	}
	switch h := m.refreshHealth(context.Background(), false)[sp.Runtime]; h.State {
	case driver.HealthHealthy:
	case driver.HealthUndetected:
		return sp, nil, public(errdefs.ErrRuntimeAbsent, "runtime %s is not available on this host", sp.Runtime)
	default:
		return sp, nil, public(errdefs.ErrRuntimeUnavailable, "runtime %s is not usable on this host now", sp.Runtime)
	}
	// The network (it may come from the tenant's default) is settled by
	// Policy.For.
	return sp, drv, nil
}

// ValidEnv checks an environment variable a request gives (a create's,
// an exec's): a variable name that is not the exec id's, a value without
// NUL.
func ValidEnv(k, v string) error {
	if !envNameRE.MatchString(k) {
		return public(errInvalid, "env name %q is not a valid variable name", truncate(k, 64))
	}
	if k == agentproto.ExecIDEnv {
		return public(errInvalid, "env name %s is reserved", k)
	}
	if strings.IndexByte(v, 0) >= 0 {
		return public(errInvalid, "env value of %s contains a NUL byte", k)
	}
	return nil
}

// parseTemplateRef splits "name" or "name@N".
func parseTemplateRef(ref string) (string, int, error) {
	m := templateRE.FindStringSubmatch(ref)
	if m == nil {
		return "", 0, public(errInvalid, "template %q must be a name or name@version", truncate(ref, 64))
	}
	v := 0
	if m[2] != "" {
		n, err := strconv.Atoi(m[2])
		if err != nil || n < 1 {
			return "", 0, public(errInvalid, "template version must be at least 1")
		}
		v = n
	}
	return m[1], v, nil
}

// requestHash identifies a create request for idempotency. Secret values
// are left out (only their names count): a hash of a weak secret could be
// guessed offline.
func requestHash(req api.CreateSandboxRequest) string {
	names := make([]string, 0, len(req.Secrets))
	for k := range req.Secrets {
		names = append(names, k)
	}
	sort.Strings(names)
	req.Secrets = nil
	req.WaitForTemplate = false // how to wait is not what is created
	b, _ := json.Marshal(struct {
		Req     api.CreateSandboxRequest `json:"req"`
		Secrets []string                 `json:"secrets"`
	}{req, names})
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

func newSandboxID() string { return auth.RandomID("sbx_", 15) }

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}
