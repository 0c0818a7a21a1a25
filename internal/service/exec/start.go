package exec

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/service/sandbox"
	"github.com/airlockhq/airlock/internal/template"
)

// Timing of a template's start and ready commands.
const (
	// readyCheckTimeout bounds one run of a ready command: it is a probe
	// (curl a port, test a file), not work.
	readyCheckTimeout = 10 * time.Second
	// readyPollMax is the longest pause between two ready checks; they
	// start 50 ms apart and back off, so a fast server is seen at once.
	readyPollMax = time.Second
)

// StartTemplate launches the template's start command as a tracked exec
// (its output can be followed like any exec's) and waits for its ready
// command to exit 0. It fails if the start command ends first or ctx ends.
func (m *Engine) StartTemplate(ctx context.Context, sb *sandbox.Live, cfg template.Config) error {
	user := cfg.User
	if user == "" {
		user = agentproto.DefaultUser
	}
	startDone := make(chan api.ExecResult, 1)
	wctx, stopWait := context.WithCancel(ctx)
	defer stopWait()
	if cfg.StartCmd != "" {
		shell := cfg.StartCmd
		req := api.ExecRequest{Shell: &shell, User: user, Cwd: cfg.Workdir}
		areq, err := m.validate(req)
		var e *Exec
		if err == nil {
			e, err = m.start(ctx, sb, areq, req, Options{})
		}
		if err != nil {
			var pe *errdefs.Public
			if errors.As(err, &pe) {
				return &errdefs.Public{Msg: "template start command: " + pe.Msg, Err: err}
			}
			return fmt.Errorf("template start command: %w", err)
		}
		m.log.Debug("template start command running", "sandbox_id", sb.ID(), "exec_id", e.ID())
		m.goBackground(func() {
			if res, err := e.Wait(wctx); err == nil {
				startDone <- res
			}
		})
	}
	if cfg.ReadyCmd == "" {
		return nil
	}
	delay := 50 * time.Millisecond
	var last string
	for {
		ok, out, err := m.readyCheck(ctx, sb, cfg, user)
		if err != nil && ctx.Err() == nil {
			return fmt.Errorf("template ready check: %w", err)
		}
		if ok {
			return nil
		}
		last = out
		select {
		case res := <-startDone:
			how := res.Status
			if res.ExitCode != nil {
				how = fmt.Sprintf("%s (exit code %d)", res.Status, *res.ExitCode)
			}
			// The template's own defect: a retry starts the same command
			// and fails the same way, so it is no retryable 503.
			return &errdefs.Public{
				Msg: fmt.Sprintf("template start command %s before the ready check passed", how),
				Err: errdefs.ErrTemplateUnsupported,
			}
		case <-ctx.Done():
			msg := "template ready check did not pass in time"
			if last != "" {
				msg += "; its last output: " + truncate(last, 512)
			}
			return &errdefs.Public{Msg: msg, Err: fmt.Errorf("%w: %w", errdefs.ErrUnavailable, ctx.Err())}
		case <-time.After(delay):
		}
		delay = min(delay*2, readyPollMax)
	}
}

// readyCheck runs the ready command once and reports whether it exited 0,
// with its output (secrets masked).
func (m *Engine) readyCheck(ctx context.Context, sb *sandbox.Live, cfg template.Config, user string) (bool, string, error) {
	env := sb.Env(nil)
	var (
		res agentproto.ExecResult
		out []byte
	)
	c, err := sb.Agent(ctx)
	if err != nil {
		return false, "", err
	}
	st, err := c.Exec(ctx, agentproto.ExecRequest{
		ID: auth.RandomID("ex_", 15), Shell: cfg.ReadyCmd, User: user, Cwd: cfg.Workdir, Env: env,
		TimeoutMS: readyCheckTimeout.Milliseconds(), MaxOutputBytes: 64 << 10,
	})
	if err != nil {
		return false, "", err
	}
	defer st.Close()
	for {
		ev, err := st.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return false, "", err
		}
		if ev.Type == agentproto.EventExit && ev.Result != nil {
			res = *ev.Result
			break
		}
		out = append(out, ev.Data...)
	}
	return res.Status == agentproto.StatusExited && res.ExitCode == 0, sb.Redactor().Redact(string(out)), nil
}
