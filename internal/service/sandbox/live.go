package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/redact"
	"github.com/airlockhq/airlock/internal/store"
)

// Live is one live sandbox (starting, running, paused or stopping): the
// in-memory side of its record, its agent connection, its secrets and the
// defaults of its execs. The services that work in a sandbox (exec, files,
// previews, code, accounting) get it from the Service (Running, Live,
// Lookup) and use its exported methods; everything else of it is the
// lifecycle's.
type Live struct {
	id     string
	tenant string
	drv    driver.Driver
	m      *Service

	// opMu serialises lifecycle operations (the driver contract wants calls
	// for one id serialised by the caller).
	opMu sync.Mutex

	// mu guards rec.
	mu  sync.Mutex
	rec store.Sandbox

	// ready is closed when create finished, one way or the other.
	ready chan struct{}

	// envMu guards secrets, env and red: a pool claim gives a running
	// member its create's (pool.go) while its processes may be followed.
	envMu   sync.RWMutex
	secrets map[string]string
	env     map[string]string
	red     *redact.Redactor
	// tmplUser and tmplWorkdir are the template's USER and WORKDIR, the
	// defaults of execs (execDefaults); "" when it set none.
	tmplUser, tmplWorkdir string

	dialMu sync.Mutex
	client *agentclient.Client

	// expiring is set while the TTL loop stops (or pauses) the sandbox;
	// idling while the idle loop pauses it.
	expiring, idling bool
	// halted is set while the sandbox's processes are stopped on purpose:
	// paused to disk, or on the way there or back. Its agent's going away
	// is then no crash, and nothing dials it.
	halted atomic.Bool
	// diskOnly is set while the sandbox is paused to disk: it holds only
	// its disk (and a host slot), so the tenant's cpu and memory quota
	// leave it out until a resume takes them again (readmit).
	diskOnly atomic.Bool
	// activityDirty says rec.LastActiveAt moved since it was stored;
	// streams counts the open streams (Active) that keep it awake.
	activityDirty bool
	streams       atomic.Int64
	// restartedAt is when a resume from disk last had the template's
	// start command ready (guarded by mu).
	restartedAt time.Time
	// execRecovery is set for a sandbox recovered while paused: its execs
	// are re-attached once it is resumed.
	execRecovery bool
	// gone is closed when the sandbox stops being live (deleted, crashed,
	// expired): trackers finish their execs as killed, or as error when
	// crashCode says it died on its own.
	gone     chan struct{}
	goneOnce sync.Once
	// crashCode is set (before gone is closed) to the sandbox error code
	// when the sandbox died rather than being stopped.
	crashCode atomic.Pointer[string]

	// res is what the sandbox holds against its tenant's quota, read
	// from its spec once (quota.go).
	resOnce sync.Once
	res     api.Resources
}

// ID is the sandbox's id (sbx_…).
func (sb *Live) ID() string { return sb.id }

// Tenant is the tenant the sandbox belongs to: it pays for what runs in
// it, whoever asks.
func (sb *Live) Tenant() string { return sb.tenant }

// Driver is the runtime the sandbox runs on.
func (sb *Live) Driver() driver.Driver { return sb.drv }

// State is the sandbox's observed state (api.State…).
func (sb *Live) State() string { return sb.state() }

// Record is a copy of the sandbox's stored record.
func (sb *Live) Record() store.Sandbox { return sb.snapshot() }

// Spec is the sandbox's normalised create request as stored.
func (sb *Live) Spec() Spec {
	var sp Spec
	_ = json.Unmarshal(sb.snapshot().Spec, &sp)
	return sp
}

// Template names the sandbox's template as name:version ("" when unknown).
func (sb *Live) Template() string {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.rec.Template == "" {
		return ""
	}
	return sb.rec.Template + ":" + strconv.Itoa(sb.rec.TemplateVersion)
}

// Ready is closed once the sandbox's create finished, one way or the
// other: before, its template's start command is running.
func (sb *Live) Ready() <-chan struct{} { return sb.ready }

// Gone is closed when the sandbox stops being live (deleted, crashed,
// expired); GoneCode then says why.
func (sb *Live) Gone() <-chan struct{} { return sb.gone }

// IsGone reports whether Gone is closed.
func (sb *Live) IsGone() bool { return sb.isGone() }

// GoneCode is the sandbox error code the sandbox died with
// (api.SandboxCode…), "" if it was stopped.
func (sb *Live) GoneCode() string { return sb.goneCode() }

// Redactor masks the sandbox's secrets: everything of the sandbox's that
// leaves it through a service passes it.
func (sb *Live) Redactor() *redact.Redactor {
	sb.envMu.RLock()
	defer sb.envMu.RUnlock()
	return sb.red
}

// Env is the environment of a process in the sandbox: the sandbox's env,
// then its secrets (unless they are files), then extra. The map is the
// caller's, to clear once the agent has it.
func (sb *Live) Env(extra map[string]string) map[string]string {
	sb.envMu.RLock()
	defer sb.envMu.RUnlock()
	env := make(map[string]string, len(sb.env)+len(sb.secrets)+len(extra))
	maps.Copy(env, sb.env)
	maps.Copy(env, sb.secrets)
	maps.Copy(env, extra)
	return env
}

// ExecDefaults fills in the user and cwd of a process that names none:
// the template's USER and WORKDIR (as docker exec does), else the default
// user, whose home the agent picks ("" cwd).
func (sb *Live) ExecDefaults(user, cwd string) (string, string) { return sb.execDefaults(user, cwd) }

// Agent returns the sandbox's agent client, dialling (again) when there
// is none or the last one dropped.
func (sb *Live) Agent(ctx context.Context) (*agentclient.Client, error) { return sb.agent(ctx) }

// WithAgent runs fn with the sandbox's agent client, once more on a new
// connection if the first one dropped: fn must be safe to repeat.
func (sb *Live) WithAgent(ctx context.Context, fn func(*agentclient.Client) error) error {
	return sb.withAgent(ctx, fn)
}

// CheckAlive asks the runtime whether the sandbox still runs; one that
// does not is ended as crashed. Services call it when its agent stops
// answering, to tell a crash from a platform fault.
func (sb *Live) CheckAlive() bool { return sb.m.checkAlive(sb) }

// Audit queues an audit event of type typ of the sandbox, tagged with the
// request of ctx; detail's strings are masked of its secrets.
func (sb *Live) Audit(ctx context.Context, typ string, detail any) {
	sb.m.recordEvent(ctx, sb, typ, detail)
}

// markGone closes the sandbox's gone channel once.
func (sb *Live) markGone() {
	sb.goneOnce.Do(func() { close(sb.gone) })
}

// goneCode is the sandbox error code it died with, "" if it was stopped.
func (sb *Live) goneCode() string {
	if c := sb.crashCode.Load(); c != nil {
		return *c
	}
	return ""
}

// state returns the current observed state.
func (sb *Live) state() string {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return sb.rec.State
}

// snapshot returns a copy of the record.
func (sb *Live) snapshot() store.Sandbox {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return sb.rec
}

// setState moves the sandbox to state to, applying mutate to the record,
// and persists it. An illegal move is a bug: it is logged loudly and
// returned as an internal error, and nothing changes.
func (sb *Live) setState(ctx context.Context, to string, mutate func(*store.Sandbox)) error {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return sb.setStateLocked(ctx, to, mutate)
}

func (sb *Live) setStateLocked(ctx context.Context, to string, mutate func(*store.Sandbox)) error {
	from := sb.rec.State
	if from != to {
		if err := checkTransition(from, to); err != nil {
			sb.m.log.Error("BUG: illegal sandbox state transition", "sandbox_id", sb.id, "from", from, "to", to)
			return err
		}
	}
	rec := sb.rec
	rec.State = to
	if mutate != nil {
		mutate(&rec)
	}
	if err := sb.m.store.UpdateSandbox(ctx, rec); err != nil {
		return fmt.Errorf("saving sandbox %s state %s: %w", sb.id, to, err)
	}
	sb.rec = rec
	if from != to {
		sb.m.log.Debug("sandbox state", "sandbox_id", sb.id, "tenant", sb.tenant, "from", from, "to", to)
	}
	return nil
}

// update persists mutate without a state change.
func (sb *Live) update(ctx context.Context, mutate func(*store.Sandbox)) error {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	rec := sb.rec
	mutate(&rec)
	if err := sb.m.store.UpdateSandbox(ctx, rec); err != nil {
		return fmt.Errorf("saving sandbox %s: %w", sb.id, err)
	}
	sb.rec = rec
	return nil
}

// ValidUser reports whether name may name a user of a sandbox in a
// request (the agent then checks that the sandbox has it).
func ValidUser(name string) bool { return userRE.MatchString(name) }
