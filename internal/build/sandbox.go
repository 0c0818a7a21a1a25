package build

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/template"
)

// buildSandbox is a running build sandbox.
type buildSandbox struct {
	b      *Builder
	id     string
	client *agentclient.Client
	netCln func()
}

// startSandbox creates and starts a build sandbox on layers (refs) and
// connects to its agent. With network set, it gets the network the
// Network hook provides. The caller must call destroy.
func (b *Builder) startSandbox(ctx context.Context, layers []string, network bool) (*buildSandbox, error) {
	if b.cfg.Driver == nil {
		return nil, userErr(errdefs.ErrRuntimeUnavailable, "no runtime for build sandboxes on this host (RUN and COPY need a driver that captures layers: runc or gvisor)")
	}
	paths, err := b.tmpl.LayerPaths(layers)
	if err != nil {
		return nil, err
	}
	sb := &buildSandbox{b: b, id: auth.RandomID(BuildSandboxPrefix, 15)}
	spec := driver.Spec{
		ID:        sb.id,
		Template:  driver.Template{Name: "build", Layers: paths},
		Resources: b.cfg.Resources,
		Hostname:  "build",
	}
	if network && b.cfg.Network != nil {
		n, cleanup, err := b.cfg.Network(ctx, sb.id)
		if err != nil {
			return nil, fmt.Errorf("build sandbox network: %w", err)
		}
		spec.NetNSPath, spec.ResolvConfPath, sb.netCln = n.NetNSPath, n.ResolvConfPath, cleanup
	}
	if _, err := b.cfg.Driver.Create(ctx, spec); err != nil {
		sb.destroy(ctx)
		return nil, fmt.Errorf("creating build sandbox: %w", err)
	}
	if err := b.cfg.Driver.Start(ctx, sb.id); err != nil {
		sb.destroy(ctx)
		return nil, fmt.Errorf("starting build sandbox: %w", err)
	}
	dctx, cancel := context.WithTimeout(ctx, agentDialTimeout)
	defer cancel()
	conn, err := b.cfg.Driver.DialAgent(dctx, sb.id)
	if err != nil {
		sb.destroy(ctx)
		return nil, fmt.Errorf("dialling build sandbox agent: %w", err)
	}
	c, err := agentclient.New(conn)
	if err != nil {
		sb.destroy(ctx)
		return nil, fmt.Errorf("build sandbox agent: %w", err)
	}
	sb.client = c
	if err := c.Ping(dctx); err != nil {
		sb.destroy(ctx)
		return nil, fmt.Errorf("build sandbox agent: %w", err)
	}
	return sb, nil
}

// destroy removes the sandbox and its network; it cannot be cancelled.
func (sb *buildSandbox) destroy(ctx context.Context) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if sb.client != nil {
		sb.client.Close()
		sb.client = nil
	}
	if err := sb.b.cfg.Driver.Destroy(cctx, sb.id); err != nil {
		sb.b.log.Error("destroying build sandbox", "sandbox_id", sb.id, "err", err)
	}
	if sb.netCln != nil {
		sb.netCln()
		sb.netCln = nil
	}
}

// tail keeps the last bytes written to it, for error messages.
type tail struct {
	buf []byte
	max int
}

func (t *tail) Write(p []byte) (int, error) {
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = t.buf[over:]
	}
	return len(p), nil
}

func (t *tail) String() string {
	s := strings.ToValidUTF8(string(t.buf), "?")
	return strings.TrimRight(s, "\n")
}

// exec runs req in the sandbox, copying its output to out, and returns
// its result.
func (sb *buildSandbox) exec(ctx context.Context, req agentproto.ExecRequest, out io.Writer) (agentproto.ExecResult, error) {
	req.ID = auth.RandomID("ex_", 15)
	st, err := sb.client.Exec(ctx, req)
	if err != nil {
		return agentproto.ExecResult{}, err
	}
	defer st.Close()
	for {
		ev, err := st.Next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return agentproto.ExecResult{}, errors.New("exec stream ended without a result")
			}
			return agentproto.ExecResult{}, err
		}
		if ev.Type == agentproto.EventExit && ev.Result != nil {
			return *ev.Result, nil
		}
		if len(ev.Data) > 0 {
			out.Write(ev.Data)
		}
	}
}

// ensureWorkdir makes dir if it is missing, owned by user (as BuildKit
// does), in the same sandbox as the step that needs it.
func (sb *buildSandbox) ensureWorkdir(ctx context.Context, dir, user string, out io.Writer) error {
	if dir == "" || dir == "/" {
		return nil
	}
	if user == "" {
		user = "root"
	}
	res, err := sb.exec(ctx, agentproto.ExecRequest{
		Argv: []string{"/bin/sh", "-c", `[ -d "$1" ] || { mkdir -p -- "$1" && { [ "$2" = root ] || chown -- "$2" "$1"; }; }`, "sh", dir, user},
		User: "root", Cwd: "/", TimeoutMS: 60_000,
	}, out)
	if err != nil {
		return err
	}
	if res.Status != agentproto.StatusExited || res.ExitCode != 0 {
		return fmt.Errorf("cannot create WORKDIR %s (%s)", dir, describe(res, 0))
	}
	return nil
}

// describe says how an exec ended.
func describe(res agentproto.ExecResult, timeout time.Duration) string {
	switch res.Status {
	case agentproto.StatusExited:
		return fmt.Sprintf("exited with status %d", res.ExitCode)
	case agentproto.StatusTimeout:
		return fmt.Sprintf("did not finish within %s", timeout)
	case agentproto.StatusOOM:
		return "ran out of memory"
	case agentproto.StatusKilled:
		return "was killed (" + res.Signal + ")"
	case agentproto.StatusError:
		return "could not start: " + res.Error
	}
	return res.Status
}

// capture stops the sandbox and copies its writable layer into the layer
// store as key. The driver says where the layer is, how its owners map and
// which of its top-level names are the runtime's (mount points it made, the
// agent's directory), not the step's.
func (sb *buildSandbox) capture(ctx context.Context, key string, meta template.LayerMeta) (string, template.CaptureStats, error) {
	b := sb.b
	sb.client.Close()
	sb.client = nil
	// Nothing may change the layer while it is copied: stop every process
	// (daemons a RUN left behind included), keep the mounts.
	if err := b.cfg.Driver.Stop(ctx, sb.id, 0); err != nil {
		return "", template.CaptureStats{}, fmt.Errorf("stopping build sandbox: %w", err)
	}
	layer, err := b.cfg.Driver.WritableLayer(ctx, sb.id)
	if err != nil {
		return "", template.CaptureStats{}, fmt.Errorf("locating the build sandbox's layer: %w", err)
	}
	w, err := b.tmpl.NewLayer()
	if err != nil {
		return "", template.CaptureStats{}, err
	}
	shift := template.IDShift{Base: layer.UIDBase, Count: layer.IDCount}
	stats, err := template.CaptureUpper(ctx, layer.Dir, w.Root(), shift, layer.RuntimeNames)
	if err != nil {
		w.Discard()
		return "", stats, fmt.Errorf("capturing the layer: %w", err)
	}
	ref, err := w.Commit(key, meta)
	return ref, stats, err
}
