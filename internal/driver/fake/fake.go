// Package fake is the driver of the tests above the drivers (manager, server, E2B planes): each sandbox is a real in-process agent over a socketpair, rooted in a temp dir, with no isolation at all (driver.IsolationNone).
//
// The fake stands in for the isolation only: exec and file operations run
// through the real agent protocol and the real agent, on the host as the
// test user (uid 1000 when the tests run as root). It survives a manager
// "restart" the way a real runtime does, so recovery can be tested, and it
// can simulate crashes, OOM kills and failures. It keeps the driver
// contract the conformance suite checks where a driver without a boundary
// can (internal/driver/drivertest, see fake_test.go).
package fake

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/agent"
	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// Driver is the fake driver.
type Driver struct {
	name string
	dir  string

	mu        sync.Mutex
	sandboxes map[string]*sbx
	// FailCreate and FailStart, when set, make the next calls fail.
	failCreate error
	failStart  error
	health     driver.Health
	created    int
	destroyed  int
	netModes   []driver.NetworkMode
	atStart    bool
	specs      map[string]driver.Spec
}

type sbx struct {
	id     string
	root   string
	srv    *agent.Server
	state  driver.State
	oom    uint64
	signal string
	conns  []net.Conn
	wg     sync.WaitGroup
}

var (
	_ driver.Driver = (*Driver)(nil)
	_ driver.Pauser = (*Driver)(nil)
	_ driver.Stater = (*Driver)(nil)
	_ driver.Lister = (*Driver)(nil)
)

// validID matches the ids driver.Spec promises, as the real drivers check.
var validID = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

// New returns a fake driver named name whose sandboxes live under dir.
func New(name, dir string) *Driver {
	return &Driver{
		name: name, dir: dir, sandboxes: map[string]*sbx{},
		health:   driver.Health{State: driver.HealthHealthy, Description: "fake driver: in-process agents, no isolation"},
		netModes: []driver.NetworkMode{driver.NetworkNone},
		specs:    map[string]driver.Spec{},
	}
}

// SetNetworkModes sets the network modes Capabilities reports (default:
// none only). The fake ignores the namespace it is given: its sandboxes
// have the host's network.
func (d *Driver) SetNetworkModes(modes ...driver.NetworkMode) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.netModes = modes
}

// SetInterfacesAtStart sets Capabilities.InterfacesAtStart.
func (d *Driver) SetInterfacesAtStart(v bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.atStart = v
}

// Spec returns the spec sandbox id was created with.
func (d *Driver) Spec(id string) (driver.Spec, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	s, ok := d.specs[id]
	return s, ok
}

// Name implements driver.Driver.
func (d *Driver) Name() string { return d.name }

// Capabilities implements driver.Driver.
func (d *Driver) Capabilities() driver.Capabilities {
	d.mu.Lock()
	defer d.mu.Unlock()
	return driver.Capabilities{Isolation: driver.IsolationNone, Pause: true, NetworkModes: append([]driver.NetworkMode(nil), d.netModes...),
		InterfacesAtStart: d.atStart}
}

// SetHealth sets what Probe reports.
func (d *Driver) SetHealth(h driver.Health) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.health = h
}

// Probe implements driver.Driver.
func (d *Driver) Probe(context.Context) driver.Health {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.health
}

// FailNextCreate makes the next Create fail with err.
func (d *Driver) FailNextCreate(err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.failCreate = err
}

// FailNextStart makes the next Start fail with err (after Create succeeded).
func (d *Driver) FailNextStart(err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.failStart = err
}

// Create implements driver.Driver: a sandbox root with /etc/passwd, /etc/group
// and /home/user, and an agent server for it. The template's layers, when
// it has any, must exist; their files are not used.
func (d *Driver) Create(ctx context.Context, spec driver.Spec) (*driver.Handle, error) {
	if !validID.MatchString(spec.ID) {
		return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, "invalid sandbox id %q", spec.ID)
	}
	for _, l := range spec.Template.Layers {
		if fi, err := os.Stat(l); err != nil || !fi.IsDir() {
			return nil, errdefs.Wrap(errdefs.ErrNotFound, "template layer %q", l)
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.failCreate; err != nil {
		d.failCreate = nil
		return nil, err
	}
	if _, ok := d.sandboxes[spec.ID]; ok {
		return nil, fmt.Errorf("%w: sandbox %s", errdefs.ErrAlreadyExists, spec.ID)
	}
	root := filepath.Join(d.dir, spec.ID)
	if err := makeRoot(root); err != nil {
		return nil, err
	}
	if spec.SecretsTmpfs {
		// Stands in for the runc driver's sticky, world-writable tmpfs.
		dir := filepath.Join(root, "run", "secrets")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		if err := os.Chmod(dir, 0o777|os.ModeSticky); err != nil {
			return nil, err
		}
	}
	d.created++
	d.specs[spec.ID] = spec
	d.sandboxes[spec.ID] = &sbx{id: spec.ID, root: root, state: driver.StateCreated}
	return &driver.Handle{ID: spec.ID, Driver: d.name, Version: 1}, nil
}

// makeRoot prepares a sandbox root the agent can serve files from and run
// commands as "user" in.
func makeRoot(root string) error {
	uid := 1000
	if os.Geteuid() != 0 {
		uid = os.Geteuid()
	}
	home := filepath.Join(root, "home", "user")
	for _, dir := range []string{filepath.Join(root, "etc"), home, filepath.Join(root, "tmp"), filepath.Join(root, "root")} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	// As in a template: anyone may write to /tmp.
	if err := os.Chmod(filepath.Join(root, "tmp"), 0o777|os.ModeSticky); err != nil {
		return err
	}
	// uid 1000 must be able to reach its home inside the test's temp dirs.
	for dir := home; dir != "/"; dir = filepath.Dir(dir) {
		if st, err := os.Stat(dir); err == nil && st.Mode().Perm()&0o005 != 0o005 {
			if err := os.Chmod(dir, st.Mode().Perm()|0o005); err != nil {
				return err
			}
		}
	}
	if os.Geteuid() == 0 {
		if err := os.Chown(home, uid, uid); err != nil {
			return err
		}
	}
	passwd := fmt.Sprintf("root:x:0:0:root:/root:/bin/sh\nuser:x:%d:%d:User:%s:/bin/sh\n", uid, uid, home)
	group := fmt.Sprintf("root:x:0:\nuser:x:%d:\n", uid)
	if err := os.WriteFile(filepath.Join(root, "etc", "passwd"), []byte(passwd), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(root, "etc", "group"), []byte(group), 0o644)
}

// Start implements driver.Driver.
func (d *Driver) Start(ctx context.Context, id string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	s, ok := d.sandboxes[id]
	if !ok {
		return fmt.Errorf("%w: sandbox %s", errdefs.ErrNotFound, id)
	}
	if err := d.failStart; err != nil {
		d.failStart = nil
		return err
	}
	s.srv = agent.NewServer(agent.Config{
		Root:       s.root,
		PasswdFile: filepath.Join(s.root, "etc", "passwd"),
		GroupFile:  filepath.Join(s.root, "etc", "group"),
		// The test process has other children (go test's own); the agent
		// must only wait for its own.
		Subreaper: false,
	})
	s.state = driver.StateRunning
	return nil
}

// Stop implements driver.Driver.
func (d *Driver) Stop(ctx context.Context, id string, timeout time.Duration) error {
	d.mu.Lock()
	s := d.sandboxes[id]
	if s != nil {
		s.state = driver.StateStopped
	}
	d.mu.Unlock()
	if s == nil {
		return fmt.Errorf("%w: sandbox %s", errdefs.ErrNotFound, id)
	}
	d.kill(s)
	return nil
}

// kill ends the agent and every connection to it, like a dying init. The
// caller has already moved the sandbox out of the running state (under
// d.mu), so no new connection can be dialled meanwhile.
func (d *Driver) kill(s *sbx) {
	d.mu.Lock()
	srv, conns := s.srv, s.conns
	s.conns = nil
	d.mu.Unlock()
	if srv != nil {
		srv.Close()
	}
	for _, c := range conns {
		c.Close()
	}
	s.wg.Wait()
}

// Destroy implements driver.Driver.
func (d *Driver) Destroy(ctx context.Context, id string) error {
	d.mu.Lock()
	s := d.sandboxes[id]
	delete(d.sandboxes, id)
	if s != nil {
		d.destroyed++
		s.state = driver.StateUnknown
	}
	d.mu.Unlock()
	if s == nil {
		return nil
	}
	d.kill(s)
	return os.RemoveAll(s.root)
}

// Recover implements driver.Driver: the fake's sandboxes outlive managers.
func (d *Driver) Recover(ctx context.Context, h *driver.Handle) error {
	if h == nil {
		return errdefs.Wrap(errdefs.ErrInvalidArgument, "nil handle")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	s, ok := d.sandboxes[h.ID]
	if !ok || (s.state != driver.StateRunning && s.state != driver.StatePaused) {
		return fmt.Errorf("%w: sandbox %s", errdefs.ErrNotFound, h.ID)
	}
	return nil
}

// Inspect implements driver.Driver: a destroyed or never created sandbox
// is not found.
func (d *Driver) Inspect(ctx context.Context, id string) (driver.Status, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	s, ok := d.sandboxes[id]
	if !ok {
		return driver.Status{}, fmt.Errorf("%w: sandbox %s", errdefs.ErrNotFound, id)
	}
	return driver.Status{State: s.state, OOMKills: s.oom, ExitSignal: s.signal, Pid: 1}, nil
}

// DialAgent implements driver.Driver: a socketpair served by the sandbox's
// agent.
func (d *Driver) DialAgent(ctx context.Context, id string) (net.Conn, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	s, ok := d.sandboxes[id]
	if !ok {
		return nil, fmt.Errorf("%w: sandbox %s", errdefs.ErrNotFound, id)
	}
	if s.state != driver.StateRunning && s.state != driver.StatePaused {
		return nil, errdefs.Wrap(errdefs.ErrUnavailable, "sandbox %s agent: init has ended", id)
	}
	a, b, err := socketPair()
	if err != nil {
		return nil, err
	}
	s.conns = append(s.conns, b)
	s.wg.Add(1)
	srv := s.srv
	go func() {
		defer s.wg.Done()
		srv.ServeConn(context.Background(), b)
	}()
	return a, nil
}

// Pause implements driver.Pauser (state only: the fake cannot freeze).
func (d *Driver) Pause(ctx context.Context, id string) error {
	return d.setState(id, driver.StatePaused)
}

// Resume implements driver.Pauser.
func (d *Driver) Resume(ctx context.Context, id string) error {
	return d.setState(id, driver.StateRunning)
}

func (d *Driver) setState(id string, st driver.State) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	s, ok := d.sandboxes[id]
	if !ok {
		return fmt.Errorf("%w: sandbox %s", errdefs.ErrNotFound, id)
	}
	s.state = st
	return nil
}

// Stats implements driver.Stater.
func (d *Driver) Stats(ctx context.Context, id string) (driver.Stats, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	s, ok := d.sandboxes[id]
	if !ok {
		return driver.Stats{}, fmt.Errorf("%w: sandbox %s", errdefs.ErrNotFound, id)
	}
	return driver.Stats{CPUSeconds: 1.5, MemoryBytes: 1 << 20, PIDs: 1, OOMKills: s.oom}, nil
}

// Crash simulates the sandbox's init dying (killed by SIGKILL): the agent
// and its connections go away, the runtime reports it stopped.
func (d *Driver) Crash(id string) {
	d.mu.Lock()
	s := d.sandboxes[id]
	if s != nil {
		s.state, s.signal = driver.StateStopped, "SIGKILL"
	}
	d.mu.Unlock()
	if s != nil {
		d.kill(s)
	}
}

// Vanish makes the runtime forget the sandbox entirely (host reboot): the
// agent is gone and Recover reports not found. Its files stay for Destroy.
func (d *Driver) Vanish(id string) {
	d.Crash(id)
	d.mu.Lock()
	defer d.mu.Unlock()
	if s := d.sandboxes[id]; s != nil {
		s.state = driver.StateUnknown
	}
}

// AddOOMKill bumps the sandbox's OOM kill counter.
func (d *Driver) AddOOMKill(id string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if s := d.sandboxes[id]; s != nil {
		s.oom++
	}
}

// Root returns the host directory of sandbox id's files.
func (d *Driver) Root(id string) string { return filepath.Join(d.dir, id) }

// List implements driver.Lister.
func (d *Driver) List(context.Context) ([]string, error) { return d.Live(), nil }

// Live returns the ids the driver holds (created and not destroyed).
func (d *Driver) Live() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for id := range d.sandboxes {
		out = append(out, id)
	}
	return out
}

// Counts returns how many sandboxes were created and destroyed.
func (d *Driver) Counts() (created, destroyed int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.created, d.destroyed
}

// Close destroys every sandbox left (the test's own cleanup).
func (d *Driver) Close() error {
	var errs []error
	for _, id := range d.Live() {
		errs = append(errs, d.Destroy(context.Background(), id))
	}
	return errors.Join(errs...)
}

func socketPair() (net.Conn, net.Conn, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	var conns [2]net.Conn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "socketpair")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			if i == 1 {
				conns[0].Close()
			}
			unix.Close(fds[1])
			return nil, nil, err
		}
		conns[i] = c
	}
	return conns[0], conns[1], nil
}
