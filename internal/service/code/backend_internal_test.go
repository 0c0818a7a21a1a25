package code

import (
	"errors"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// TestKernelStartError: a kernel that cannot start because of the template
// or the request fails the same way every time, so it is a 4xx saying what
// to change; only a start that may pass later is retryable (unavailable).
func TestKernelStartError(t *testing.T) {
	tests := []struct {
		name   string
		res    *agentproto.ExecResult
		stderr string
		want   error
		msg    string
	}{
		{"no_jupyter", &agentproto.ExecResult{ExitCode: 1},
			"Traceback (most recent call last):\n  ...\nModuleNotFoundError: No module named 'jupyter_client'\n",
			errdefs.ErrTemplateUnsupported, "jupyter_client"},
		{"no_ipykernel", &agentproto.ExecResult{ExitCode: 1}, "jupyter_client.kernelspec.NoSuchKernel: No such kernel named python3\n",
			errdefs.ErrTemplateUnsupported, "python3"},
		{"no_node", &agentproto.ExecResult{ExitCode: 127}, "sh: 1: exec: node: not found\n", errdefs.ErrTemplateUnsupported, "node"},
		{"no_python", &agentproto.ExecResult{ExitCode: 127}, "", errdefs.ErrTemplateUnsupported, "template"},
		{"missing_cwd", &agentproto.ExecResult{ExitCode: -1, Error: "cwd /no/such/dir: no such file or directory"},
			"cwd /no/such/dir: no such file or directory", errdefs.ErrInvalidArgument, "/no/such/dir"},
		{"killed_at_start", &agentproto.ExecResult{ExitCode: 137, Signal: "SIGKILL"}, "", errdefs.ErrUnavailable, "kernel exited at start"},
		{"fork_failed", &agentproto.ExecResult{ExitCode: -1, Error: "starting /bin/sh: resource temporarily unavailable"},
			"starting /bin/sh: resource temporarily unavailable", errdefs.ErrUnavailable, "resource temporarily unavailable"},
		{"stream_lost", nil, "", errdefs.ErrUnavailable, "kernel exited at start"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := kernelStartError(tt.res, tt.stderr, func(s string) string { return s })
			if !errors.Is(err, tt.want) {
				t.Fatalf("class of %v, want %v", err, tt.want)
			}
			if tt.want != errdefs.ErrTemplateUnsupported && errors.Is(err, errdefs.ErrTemplateUnsupported) {
				t.Fatalf("%v is template_unsupported", err)
			}
			if (tt.want == errdefs.ErrUnavailable) != errors.Is(err, errdefs.ErrUnavailable) {
				t.Fatalf("%v: retryable %v, want %v", err, errors.Is(err, errdefs.ErrUnavailable), tt.want == errdefs.ErrUnavailable)
			}
			var pe *errdefs.Public
			if !errors.As(err, &pe) || !strings.Contains(pe.Msg, tt.msg) {
				t.Fatalf("message of %v lacks %q", err, tt.msg)
			}
		})
	}
}
