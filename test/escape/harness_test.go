package escape

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/client"
	"github.com/airlockhq/airlock/internal/config"
	"github.com/airlockhq/airlock/internal/testutil"
	"github.com/airlockhq/airlock/internal/testutil/daemontest"
)

// Timeouts of the harness's own waits.
const (
	// callTimeout bounds one API call of the harness (create, exec, files);
	// the slowest attack exec (memory bomb) ends within seconds.
	callTimeout = 2 * time.Minute
	// canaryWait is how long the neighbour's canary may stall before the
	// neighbour counts as affected: long enough for a host loaded by a
	// fork bomb or CPU hog in another sandbox, short enough to notice a
	// canary that really stopped.
	canaryWait = 30 * time.Second
	// cleanupTimeout bounds the deletion of one sandbox at the end of a test.
	cleanupTimeout = time.Minute
)

// suiteTTL is the time to live of the suite's sandboxes: longer than any
// run of the suite.
const suiteTTL = 2 * time.Hour

// maxDiskMB is the suite daemon's max_resources.disk_mb: the largest
// writable layer storage accepts (16 TiB), far beyond any host's disk.
const maxDiskMB = 1 << 24

// token returns a random hex string: secrets and markers that cannot occur
// by chance in anything a sandbox prints.
func token() string { return daemontest.Token() }

// env is one in-process `airlock serve` (the suites' one daemon harness)
// with the escape suite's limits.
type env struct {
	*daemontest.Env
	t   *testing.T
	cfg config.Config
}

// startEnv starts a daemon with a fresh data dir whose templates/ is the
// shared cache. Everything it made is removed when t ends, and a leak check
// then asserts that no mount, loop device, file of a sandbox or process is
// left behind.
func startEnv(t *testing.T) *env {
	t.Helper()
	de := daemontest.Start(t, daemontest.Options{Prefix: "airlock-escape-", Configure: func(cfg *config.Config) {
		cfg.LogLevel = "info"
		// HostDiskSpace asks for more disk than the host has: the server's
		// maximum must let the request through to the driver's admission.
		cfg.MaxResources.DiskMB = maxDiskMB
		// ... and the tenant's disk quota too (its default is finite), so
		// that the driver's admission is what refuses it on any host.
		cfg.TenantQuota.DiskMB = 0
	}})
	return &env{Env: de, t: t, cfg: de.Config()}
}

// port is the API's TCP port (it changes on restart).
func (e *env) port() int {
	u, err := url.Parse(e.URL())
	if err != nil {
		e.t.Fatal(err)
	}
	p, _ := strconv.Atoi(u.Port())
	return p
}

// restart stops the daemon and starts a new one on the same data dir (on a
// new port): it re-adopts every running sandbox.
func (e *env) restart() { e.Restart() }

// client returns an SDK client authenticated as key.
func (e *env) client(key string) *client.Client { return e.Client(key) }

// admin is a client with the admin key.
func (e *env) admin() *client.Client { return e.Admin() }

// key returns the API key of tenant, created on first use.
func (e *env) key(t testing.TB, tenant string) string { return e.Key(t, tenant) }

// allKeys returns every API key the suite made, the admin key first.
func (e *env) allKeys() []string { return e.Keys() }

// raw sends one HTTP request with key, for what the SDK does not expose
// (file operations as root: ?user=root). It returns the status and body.
func (e *env) raw(t testing.TB, key, method, path string, query url.Values, body io.Reader, contentType string) (int, []byte) {
	t.Helper()
	u := e.URL() + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	res, err := (&http.Client{Transport: e.Transport()}).Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(res.Body, 64<<20))
	return res.StatusCode, b
}

// runtimes are the runtimes to attack: AIRLOCK_ESCAPE_RUNTIMES, else every
// runtime the daemon reports healthy.
func (e *env) runtimes(t *testing.T) []string {
	t.Helper()
	if v := os.Getenv("AIRLOCK_ESCAPE_RUNTIMES"); v != "" {
		return strings.Split(v, ",")
	}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	info, err := e.admin().Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, d := range info.Drivers {
		if d.Health == "healthy" {
			out = append(out, d.Name)
		} else {
			// Said, not silent: a runtime left out is coverage missing.
			t.Logf("runtime %s not tested: %s (%s)", d.Name, d.Health, d.Description)
		}
	}
	if len(out) == 0 {
		testutil.HostLacks(t, "no healthy runtime on this host")
	}
	return out
}

// info is GET /v1/info.
func (e *env) info(t testing.TB) *api.Info {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	info, err := e.admin().Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info
}

// sbx is one sandbox of the suite.
type sbx struct {
	e       *env
	tenant  string
	key     string
	id      string
	runtime string
	host    hostInfo
}

// create makes a sandbox of tenant on runtime and deletes it when t ends.
func (e *env) create(t testing.TB, tenant, runtime string, req api.CreateSandboxRequest) *sbx {
	t.Helper()
	req.Runtime = runtime
	if req.TimeoutS == nil {
		// The suite's long-lived sandboxes (the neighbour, the probe) live
		// as long as a runtime's whole run, which on a loaded machine
		// outlasts the server's default TTL (300 s): expiry must not be
		// what ends them.
		ttl := int64(suiteTTL / time.Second)
		req.TimeoutS = &ttl
	}
	key := e.key(t, tenant)
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	sb, err := e.client(key).CreateSandbox(ctx, req)
	if err != nil {
		t.Fatalf("creating a %s sandbox: %v", runtime, err)
	}
	if sb.Runtime != runtime || sb.State != api.StateRunning {
		t.Fatalf("created %+v, want a running %s sandbox", sb, runtime)
	}
	s := &sbx{e: e, tenant: tenant, key: key, id: sb.ID, runtime: runtime}
	s.host = lookupHost(e.cfg.DataDir, sb.ID)
	t.Cleanup(func() {
		s.delete(t)
		s.host.assertGone(t, s.id)
	})
	return s
}

// assertGone fails t if the sandbox's init or cgroups outlive its deletion.
func (h hostInfo) assertGone(t testing.TB, id string) {
	t.Helper()
	if !h.ok {
		return
	}
	var left []string
	if !eventually(10*time.Second, func() bool {
		left, _ = filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", path.Dir(h.cgroup), id))
		if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", h.cgroup)); err == nil {
			left = append(left, filepath.Join("/sys/fs/cgroup", h.cgroup))
		}
		// The pid may be reused by then: only the same pid namespace
		// means the init is still there.
		ns, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", h.pid))
		return len(left) == 0 && ns != h.pidNS
	}) {
		t.Errorf("sandbox %s left cgroups %v or its init %d after deletion", id, left, h.pid)
	}
}

// delete removes the sandbox (idempotent).
func (s *sbx) delete(t testing.TB) {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	if err := s.c().DeleteSandbox(ctx, s.id); err != nil && !errors.Is(err, client.ErrNotFound) {
		t.Errorf("deleting %s: %v", s.id, err)
	}
}

// c is a client of the sandbox's tenant.
func (s *sbx) c() *client.Client { return s.e.client(s.key) }

// result is an exec's outcome with its output decoded.
type result struct {
	api.ExecResult
	stdout, stderr string
}

func (r result) String() string {
	code := "none"
	if r.ExitCode != nil {
		code = strconv.Itoa(*r.ExitCode)
	}
	return fmt.Sprintf("status %s exit %s truncated %v\nstdout: %.2000s\nstderr: %.2000s", r.Status, code, r.Truncated, r.stdout, r.stderr)
}

// exited reports whether the command ran to its end with code.
func (r result) exited(code int) bool {
	return r.Status == api.ExecExited && r.ExitCode != nil && *r.ExitCode == code
}

// exec runs req and fails t if the API call itself fails.
func (s *sbx) exec(t testing.TB, req api.ExecRequest) result {
	t.Helper()
	if req.TimeoutS == nil {
		to := 60.0
		req.TimeoutS = &to
	}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	r, err := s.c().Exec(ctx, s.id, req)
	if err != nil {
		t.Fatalf("exec in %s: %v", s.id, err)
	}
	out, errb, err := client.Output(r)
	if err != nil {
		t.Fatal(err)
	}
	return result{ExecResult: *r, stdout: string(out), stderr: string(errb)}
}

// sh runs script with /bin/sh as user ("" is the default user).
func (s *sbx) sh(t testing.TB, user, script string) result {
	t.Helper()
	return s.exec(t, api.ExecRequest{Shell: &script, User: user})
}

// mustSh runs script and fails t unless it exits 0; it returns stdout.
func (s *sbx) mustSh(t testing.TB, user, script string) string {
	t.Helper()
	r := s.sh(t, user, script)
	if !r.exited(0) {
		t.Fatalf("%q as %q: %v", script, user, r)
	}
	return r.stdout
}

// alive fails t unless the sandbox still runs commands.
func (s *sbx) alive(t testing.TB) {
	t.Helper()
	if r := s.sh(t, "", "echo alive"); r.stdout != "alive\n" {
		t.Fatalf("sandbox %s no longer answers: %v", s.id, r)
	}
}

// readFile downloads path through the files API as the default user.
func (s *sbx) readFile(ctx context.Context, path string) ([]byte, error) {
	rc, err := s.c().ReadFile(ctx, s.id, path)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(io.LimitReader(rc, 64<<20))
}

// files sends a request to the files API as user (the SDK's calls act as
// the default user only).
func (s *sbx) files(t testing.TB, method, user, path string, body io.Reader, contentType string) (int, []byte) {
	t.Helper()
	q := url.Values{"path": {path}}
	if user != "" {
		q.Set("user", user)
	}
	return s.e.raw(t, s.key, method, "/v1/sandboxes/"+s.id+"/files", q, body, contentType)
}

// hostInfo is how a sandbox looks from the host: its init, pid namespace,
// uid range and cgroup. ok is false where the runtime does not expose its
// processes to the host this way (then the process checks are skipped).
type hostInfo struct {
	ok      bool
	pid     int
	pidNS   string
	uidBase uint64
	uidSize uint64
	cgroup  string // path of the pids cgroup, e.g. /airlock/sbx_…
}

// lookupHost finds the sandbox's init on the host through the runc driver's
// init.pid (see internal/driver/runc's data dir layout).
func lookupHost(dataDir, id string) hostInfo {
	b, err := os.ReadFile(filepath.Join(dataDir, "sandboxes", id, "init.pid"))
	if err != nil {
		return hostInfo{}
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return hostInfo{}
	}
	h := hostInfo{pid: pid}
	if h.pidNS, err = os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid)); err != nil {
		return hostInfo{}
	}
	m, err := os.ReadFile(fmt.Sprintf("/proc/%d/uid_map", pid))
	if err != nil {
		return hostInfo{}
	}
	f := strings.Fields(string(m))
	if len(f) < 3 {
		return hostInfo{}
	}
	h.uidBase, _ = strconv.ParseUint(f[1], 10, 64)
	h.uidSize, _ = strconv.ParseUint(f[2], 10, 64)
	h.cgroup = procCgroup(pid, "pids")
	h.ok = h.uidSize > 0 && h.cgroup != ""
	return h
}

// procCgroup returns pid's cgroup path in the v1 hierarchy of controller,
// or the unified one if the controller is not on v1.
func procCgroup(pid int, controller string) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return ""
	}
	unified := ""
	for _, line := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c == controller {
				return parts[2]
			}
		}
		if parts[1] == "" {
			unified = parts[2]
		}
	}
	return unified
}

// hostProc is one host process as the containment check sees it.
type hostProc struct {
	pid    int
	uid    uint64
	pidNS  string
	cgroup string
	comm   string
	state  string // R, S, D, Z…
}

// hostProcs lists the host's processes; ones that exit meanwhile are skipped.
func hostProcs() []hostProc {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []hostProc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			continue
		}
		p := hostProc{pid: pid}
		for _, line := range strings.Split(string(st), "\n") {
			if v, ok := strings.CutPrefix(line, "Uid:"); ok {
				if f := strings.Fields(v); len(f) > 0 {
					p.uid, _ = strconv.ParseUint(f[0], 10, 64)
				}
			}
			if v, ok := strings.CutPrefix(line, "Name:"); ok {
				p.comm = strings.TrimSpace(v)
			}
			if v, ok := strings.CutPrefix(line, "State:"); ok {
				if f := strings.Fields(v); len(f) > 0 {
					p.state = f[0]
				}
			}
		}
		if p.pidNS, err = os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid)); err != nil {
			continue
		}
		p.cgroup = procCgroup(pid, "pids")
		out = append(out, p)
	}
	return out
}

// contained fails t if a process runs with one of the sandbox's host uids
// outside its pid namespace, or sits in its pid namespace outside its
// cgroup: either would be a process that left the sandbox.
func (h hostInfo) contained(t testing.TB, id string, procs []hostProc) {
	t.Helper()
	if !h.ok {
		return
	}
	if ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", h.pid)); err != nil || ns != h.pidNS || procCgroup(h.pid, "pids") != h.cgroup {
		// The init is gone (its pid namespace with it, and every process
		// in it) or its pid was reused: the namespace's inode may be
		// another container's now (a test binary's beside this one), so
		// nothing can be judged by it.
		return
	}
	hostNS, _ := os.Readlink("/proc/self/ns/pid") // the test (daemon) runs in the host's
	mine := func(cg string) bool { return cg == h.cgroup || strings.HasPrefix(cg, h.cgroup+"/") }
	for _, p := range procs {
		if p.state == "Z" || p.state == "X" {
			// An exited task shows the root cgroup until it is reaped.
			continue
		}
		if cg := procCgroup(p.pid, "pids"); cg != p.cgroup || procExiting(p.pid) {
			// It exited, is exiting (already moved to the root cgroup)
			// or moved since the listing: judge it on a fresh reading
			// only.
			continue
		}
		inRange := p.uid >= h.uidBase && p.uid < h.uidBase+h.uidSize
		inNS := p.pidNS == h.pidNS
		// Other daemons and builders on this host (other test binaries)
		// hand out the same uid ranges to their own containers, each in a
		// pid namespace and cgroup of its own: those are not ours. A
		// process that left our sandbox is in the host's pid namespace or
		// still in our cgroup.
		otherContainer := p.pidNS != hostNS && !mine(p.cgroup)
		if inRange && !inNS && !otherContainer {
			t.Errorf("host process %d (%s) runs as sandbox %s's uid %d outside its pid namespace (cgroup %s)", p.pid, p.comm, id, p.uid, p.cgroup)
		}
		if inNS && p.cgroup != "" && !mine(p.cgroup) {
			t.Errorf("process %d (%s) of sandbox %s is in cgroup %s, not in %s", p.pid, p.comm, id, p.cgroup, h.cgroup)
		}
		if inNS && !inRange {
			// Host root (uid 0) included: only runc's own setup runs so,
			// and it is gone once the sandbox answered.
			t.Errorf("process %d (%s) of sandbox %s runs as host uid %d, outside its range", p.pid, p.comm, id, p.uid)
		}
	}
}

// nsPIDs returns the host pids of the processes in the sandbox's pid
// namespace.
func (h hostInfo) nsPIDs() []int {
	var out []int
	for _, p := range hostProcs() {
		if h.ok && p.pidNS == h.pidNS {
			out = append(out, p.pid)
		}
	}
	return out
}

// eventually polls cond every 50 ms until it holds or d passes.
func eventually(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
}
