package client

import (
	"context"
	"errors"
	"math"
	"net/http"
	"sync"
	"time"

	"github.com/airlockhq/airlock/api"
)

// closeTimeout bounds Sandbox.Close's delete: long enough for the server to
// kill and unmount (tens of ms normally), short enough that a gone server
// does not hang a deferred Close; the sandbox's own TTL is the backstop.
const closeTimeout = 30 * time.Second

// Sandbox is a handle on one sandbox: its commands, files, code
// interpreter and terminal, with paths relative to the sandbox user's home.
// It is safe for concurrent use. Make one with Create, Client.NewSandbox or
// Client.ConnectSandbox, and end it with Kill or Close:
//
//	sb, err := client.Create(ctx, client.WithTemplate("base"))
//	if err != nil { … }
//	defer sb.Close()
//	res, err := sb.Run(ctx, "echo hi")
//	fmt.Print(res.Stdout)
type Sandbox struct {
	c  *Client
	id string

	mu   sync.Mutex
	info api.Sandbox

	closeOnce sync.Once
	closeErr  error
}

// SandboxOption sets up a sandbox that Create or NewSandbox makes.
// WithEnv and the CallOptions (WithIdempotencyKey, WithHeader) are
// SandboxOptions too.
type SandboxOption interface{ applySandbox(*createConfig) }

// createConfig is what the SandboxOptions of one create built.
type createConfig struct {
	req      api.CreateSandboxRequest
	callOpts []CallOption
	noWait   bool
}

type sandboxOptionFunc func(*createConfig)

func (f sandboxOptionFunc) applySandbox(c *createConfig) { f(c) }

// applySandbox makes a CallOption (WithIdempotencyKey, WithHeader) usable
// as a SandboxOption: it applies to the create request.
func (o CallOption) applySandbox(c *createConfig) { c.callOpts = append(c.callOpts, o) }

// WithRequest starts the create request from req, the raw API type, for
// what no option sets (lifecycle, volumes, pools, snapshots…). It replaces
// what earlier options set: give it first.
func WithRequest(req api.CreateSandboxRequest) SandboxOption {
	return sandboxOptionFunc(func(c *createConfig) {
		c.req = req
		c.req.Env, c.req.Secrets, c.req.Metadata = cloneMap(req.Env), cloneMap(req.Secrets), cloneMap(req.Metadata)
		if req.Resources != nil {
			r := *req.Resources
			c.req.Resources = &r
		}
		if req.Network != nil {
			n := *req.Network
			n.Allow = append([]string(nil), n.Allow...)
			c.req.Network = &n
		}
	})
}

// WithTemplate names the template (name or name@version; default base).
func WithTemplate(name string) SandboxOption {
	return sandboxOptionFunc(func(c *createConfig) { c.req.Template = name })
}

// WithRuntime asks for a runtime: runc, gvisor or microvm. A runtime the
// server cannot provide is an error (ErrRuntimeUnavailable), never a
// silent fallback.
func WithRuntime(name string) SandboxOption {
	return sandboxOptionFunc(func(c *createConfig) { c.req.Runtime = name })
}

// WithTTL sets how long the sandbox lives before the server deletes it
// (timeout_s, rounded up to whole seconds; default the server's, 300 s).
// It is not a command's timeout: that is WithTimeout.
func WithTTL(d time.Duration) SandboxOption {
	return sandboxOptionFunc(func(c *createConfig) {
		s := max(int64(math.Ceil(d.Seconds())), 1)
		c.req.TimeoutS = &s
	})
}

// WithSecret gives the sandbox a secret: an environment variable of every
// command whose value the server masks in output, files and logs.
func WithSecret(name, value string) SandboxOption {
	return sandboxOptionFunc(func(c *createConfig) {
		if c.req.Secrets == nil {
			c.req.Secrets = map[string]string{}
		}
		c.req.Secrets[name] = value
	})
}

// WithMetadata labels the sandbox (ListOptions.Metadata finds it by them).
func WithMetadata(key, value string) SandboxOption {
	return sandboxOptionFunc(func(c *createConfig) {
		if c.req.Metadata == nil {
			c.req.Metadata = map[string]string{}
		}
		c.req.Metadata[key] = value
	})
}

func (c *createConfig) resources() *api.Resources {
	if c.req.Resources == nil {
		c.req.Resources = &api.Resources{}
	}
	return c.req.Resources
}

// WithCPU sets the sandbox's CPUs (e.g. 0.5).
func WithCPU(cpus float64) SandboxOption {
	return sandboxOptionFunc(func(c *createConfig) { c.resources().CPU = cpus })
}

// WithMemoryMB sets the sandbox's memory limit in MiB.
func WithMemoryMB(mb int64) SandboxOption {
	return sandboxOptionFunc(func(c *createConfig) { c.resources().MemoryMB = mb })
}

// WithDiskMB sets the size of the sandbox's writable layer in MiB.
func WithDiskMB(mb int64) SandboxOption {
	return sandboxOptionFunc(func(c *createConfig) { c.resources().DiskMB = mb })
}

// WithNetwork sets the egress policy: mode none (the default), allowlist
// (only allow: domains, *.domain, CIDR[:port]) or open.
func WithNetwork(mode string, allow ...string) SandboxOption {
	return sandboxOptionFunc(func(c *createConfig) {
		if c.req.Network == nil {
			c.req.Network = &api.Network{}
		}
		c.req.Network.Mode = mode
		c.req.Network.Allow = append(c.req.Network.Allow, allow...)
	})
}

// WithWaitForTemplate says whether a create whose template is being built
// (the first use of a shipped template builds it, for minutes) waits for
// the build (the default) or fails at once with ErrTemplateBuilding.
func WithWaitForTemplate(wait bool) SandboxOption {
	return sandboxOptionFunc(func(c *createConfig) { c.noWait = !wait })
}

// EnvOption sets an environment variable: of every command of the sandbox
// as a SandboxOption, of one command or cell as a RunOption.
type EnvOption struct{ key, value string }

// WithEnv sets the environment variable key to value (see EnvOption).
func WithEnv(key, value string) EnvOption { return EnvOption{key, value} }

func (o EnvOption) applySandbox(c *createConfig) {
	if c.req.Env == nil {
		c.req.Env = map[string]string{}
	}
	c.req.Env[o.key] = o.value
}

func (o EnvOption) applyRun(c *runConfig) {
	if c.env == nil {
		c.env = map[string]string{}
	}
	c.env[o.key] = o.value
}

func cloneMap(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// envHTTP is the HTTP client of the Clients that Create and Connect make
// from the environment, so that sandboxes made that way share connections.
var envHTTP = sync.OnceValue(func() *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DialContext = bulkDialer(tr.DialContext)
	return &http.Client{Transport: tr}
})

// NewFromEnv returns a Client for the server in AIRLOCK_URL (default
// DefaultURL) with the key in AIRLOCK_API_KEY: New("", "", FromEnv(), opts…).
func NewFromEnv(opts ...Option) (*Client, error) {
	return New("", "", append(opts, FromEnv())...)
}

// Create makes a sandbox on the server in AIRLOCK_URL with the key in
// AIRLOCK_API_KEY and returns once it is ready to run a command. Use
// Client.NewSandbox for a Client of your own.
func Create(ctx context.Context, opts ...SandboxOption) (*Sandbox, error) {
	c, err := NewFromEnv(WithHTTPClient(envHTTP()))
	if err != nil {
		return nil, err
	}
	return c.NewSandbox(ctx, opts...)
}

// Connect returns a handle on the existing sandbox id, on the server and
// with the key of the environment (as Create).
func Connect(ctx context.Context, id string) (*Sandbox, error) {
	c, err := NewFromEnv(WithHTTPClient(envHTTP()))
	if err != nil {
		return nil, err
	}
	return c.ConnectSandbox(ctx, id)
}

// NewSandbox makes a sandbox as opts say and returns its handle once it is
// ready to run a command. A template that is being built is waited for
// (see WithWaitForTemplate).
func (c *Client) NewSandbox(ctx context.Context, opts ...SandboxOption) (*Sandbox, error) {
	var cfg createConfig
	for _, o := range opts {
		if o != nil {
			o.applySandbox(&cfg)
		}
	}
	if !cfg.noWait {
		cfg.req.WaitForTemplate = true
	}
	s, err := c.CreateSandbox(ctx, cfg.req, cfg.callOpts...)
	if err != nil {
		return nil, err
	}
	return c.handle(s), nil
}

// ConnectSandbox returns a handle on the existing sandbox id (ErrNotFound
// when there is none the key may see).
func (c *Client) ConnectSandbox(ctx context.Context, id string) (*Sandbox, error) {
	s, err := c.GetSandbox(ctx, id)
	if err != nil {
		return nil, err
	}
	return c.handle(s), nil
}

func (c *Client) handle(s *api.Sandbox) *Sandbox {
	return &Sandbox{c: c, id: s.ID, info: *s}
}

// ID is the sandbox's id (sbx_…).
func (s *Sandbox) ID() string { return s.id }

// Client is the Client the handle calls through, for the calls the handle
// has no method for.
func (s *Sandbox) Client() *Client { return s.c }

// Info returns what the handle last learnt of the sandbox (at create,
// connect, Refresh, Pause, Resume, SetTTL): its runtime, template, state,
// expiry….
func (s *Sandbox) Info() api.Sandbox {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.info
}

func (s *Sandbox) update(sb *api.Sandbox) {
	s.mu.Lock()
	s.info = *sb
	s.mu.Unlock()
}

// Refresh asks the server for the sandbox's state now.
func (s *Sandbox) Refresh(ctx context.Context) (api.Sandbox, error) {
	sb, err := s.c.GetSandbox(ctx, s.id)
	if err != nil {
		return api.Sandbox{}, err
	}
	s.update(sb)
	return *sb, nil
}

// Pause freezes every process of the sandbox; time paused does not count
// against its TTL.
func (s *Sandbox) Pause(ctx context.Context) error {
	sb, err := s.c.Pause(ctx, s.id)
	if err != nil {
		return err
	}
	s.update(sb)
	return nil
}

// Resume thaws a paused sandbox.
func (s *Sandbox) Resume(ctx context.Context) error {
	sb, err := s.c.Resume(ctx, s.id)
	if err != nil {
		return err
	}
	s.update(sb)
	return nil
}

// SetTTL makes the sandbox expire d from now (rounded up to whole seconds).
func (s *Sandbox) SetTTL(ctx context.Context, d time.Duration) error {
	sb, err := s.c.SetTimeout(ctx, s.id, max(int64(math.Ceil(d.Seconds())), 1))
	if err != nil {
		return err
	}
	s.update(sb)
	return nil
}

// Metrics returns the sandbox's resource use now.
func (s *Sandbox) Metrics(ctx context.Context) (*api.Metrics, error) {
	return s.c.Metrics(ctx, s.id)
}

// Kill deletes the sandbox: every process, file and mount of it. Killing a
// sandbox already gone succeeds.
func (s *Sandbox) Kill(ctx context.Context) error {
	err := s.c.DeleteSandbox(ctx, s.id)
	if errors.Is(err, ErrNotFound) {
		return nil // expired, or deleted by someone else: gone either way
	}
	return err
}

// Close kills the sandbox, for defer: on a context of its own (bounded to
// 30 s), once; later calls return the first one's error.
func (s *Sandbox) Close() error {
	s.closeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
		defer cancel()
		s.closeErr = s.Kill(ctx)
	})
	return s.closeErr
}
