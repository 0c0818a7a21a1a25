package exec

import (
	"strings"

	"github.com/airlockhq/airlock/internal/lazyregexp"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/service/sandbox"
)

// signalRE is what a signal in a request must be: a name or a number.
var signalRE = lazyregexp.New(`^(SIG)?[A-Z][A-Z0-9+-]{1,15}$|^[0-9]{1,2}$`)

// validate checks req and returns the agent request without env.
func (m *Engine) validate(req api.ExecRequest) (agentproto.ExecRequest, error) {
	var a agentproto.ExecRequest
	switch {
	case len(req.Cmd) > 0 && req.Shell != nil:
		return a, public(errInvalid, "give exactly one of cmd and shell, not both")
	case len(req.Cmd) == 0 && req.Shell == nil:
		return a, public(errInvalid, "give exactly one of cmd and shell")
	case req.Shell != nil && strings.TrimSpace(*req.Shell) == "":
		return a, public(errInvalid, "shell is empty")
	case len(req.Cmd) > 0 && req.Cmd[0] == "":
		return a, public(errInvalid, "cmd[0] is empty")
	}
	for _, arg := range req.Cmd {
		if strings.IndexByte(arg, 0) >= 0 {
			return a, public(errInvalid, "cmd contains a NUL byte")
		}
	}
	if req.Shell != nil {
		if strings.IndexByte(*req.Shell, 0) >= 0 {
			return a, public(errInvalid, "shell contains a NUL byte")
		}
		a.Shell = *req.Shell
	}
	a.Argv = req.Cmd
	if req.Cwd != "" {
		if !strings.HasPrefix(req.Cwd, "/") || strings.IndexByte(req.Cwd, 0) >= 0 {
			return a, public(errInvalid, "cwd must be an absolute path")
		}
		a.Cwd = req.Cwd
	}
	// An empty user is the sandbox's default (the template's USER, else
	// agentproto.DefaultUser), chosen by Exec.
	a.User = req.User
	if a.User != "" && !sandbox.ValidUser(a.User) {
		return a, public(errInvalid, "user %q is not a valid user name", truncate(a.User, 32))
	}
	for k, v := range req.Env {
		if err := sandbox.ValidEnv(k, v); err != nil {
			return a, err
		}
	}
	if req.TimeoutS != nil {
		t := *req.TimeoutS
		if t < 0 || t > float64(m.settings.MaxExecTimeoutS) {
			return a, public(errInvalid, "timeout_s must be between 0 and %d", m.settings.MaxExecTimeoutS)
		}
		a.TimeoutMS = int64(t * 1000)
		if t > 0 && a.TimeoutMS == 0 {
			a.TimeoutMS = 1
		}
	}
	a.MaxOutputBytes = agentproto.DefaultMaxOutputBytes
	maxOut := min(m.settings.MaxExecOutputBytes, agentproto.HardMaxOutputBytes)
	a.MaxOutputBytes = min(a.MaxOutputBytes, maxOut)
	if req.MaxOutputBytes != nil {
		n := *req.MaxOutputBytes
		if n < 1 || n > maxOut {
			return a, public(errInvalid, "max_output_bytes must be between 1 and %d", maxOut)
		}
		a.MaxOutputBytes = n
	}
	if req.Stdin != nil {
		a.Stdin = []byte(*req.Stdin)
	}
	return a, nil
}

// truncate cuts s to n bytes for a message.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
