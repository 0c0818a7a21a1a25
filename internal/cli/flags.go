package cli

import (
	"crypto/rand"
	"encoding/hex"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlockhq/airlock/api"
)

// parseKV turns ["K=V", …] into a map; a key may not be empty.
func parseKV(flag string, pairs []string) (map[string]string, error) {
	if len(pairs) == 0 {
		return nil, nil
	}
	m := make(map[string]string, len(pairs))
	for _, p := range pairs {
		k, v, ok := strings.Cut(p, "=")
		if !ok || k == "" {
			return nil, usagef("--%s %q: want KEY=VALUE", flag, p)
		}
		m[k] = v
	}
	return m, nil
}

// parseSecrets turns ["NAME=VALUE", "NAME", …] into a map; a NAME alone
// takes the value of the environment variable NAME, which must be set.
func parseSecrets(args []string, getenv func(string) string) (map[string]string, error) {
	if len(args) == 0 {
		return nil, nil
	}
	m := make(map[string]string, len(args))
	for _, p := range args {
		k, v, ok := strings.Cut(p, "=")
		if k == "" {
			return nil, usagef("--secret %q: want NAME=VALUE or NAME", p)
		}
		if !ok {
			if v = getenv(k); v == "" {
				return nil, usagef("--secret %s: $%s is not set (give NAME=VALUE, or export %s)", k, k, k)
			}
		}
		m[k] = v
	}
	return m, nil
}

// parseSizeMB reads a size in MiB: "512" (MiB), "512M", "2G", "1.5G".
func parseSizeMB(flag, in string) (int64, error) {
	s := strings.TrimSpace(strings.ToUpper(in))
	mult := 1.0
	switch {
	case strings.HasSuffix(s, "GIB"), strings.HasSuffix(s, "GB"), strings.HasSuffix(s, "G"):
		mult = 1024
		s = strings.TrimRight(s, "GIB")
	case strings.HasSuffix(s, "MIB"), strings.HasSuffix(s, "MB"), strings.HasSuffix(s, "M"):
		s = strings.TrimRight(s, "MIB")
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f <= 0 || math.IsInf(f, 0) || f*mult > math.MaxInt32 {
		return 0, usagef("--%s %q: want a size like 512, 512M or 2G", flag, in)
	}
	return int64(math.Ceil(f * mult)), nil
}

// parseSeconds reads a duration: "300" (seconds) or "5m", "1h30m".
func parseSeconds(flag, s string) (float64, error) {
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		if f <= 0 || math.IsInf(f, 0) || math.IsNaN(f) {
			return 0, usagef("--%s %q: want a positive duration", flag, s)
		}
		return f, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, usagef("--%s %q: want seconds or a duration like 5m", flag, s)
	}
	return d.Seconds(), nil
}

// createFlags are the sandbox settings of `sandbox create` and `run`.
type createFlags struct {
	template, runtime  string
	cpu                float64
	memory, disk       string
	ttl                string
	env, meta          []string
	secrets            []string
	network            string
	allow              []string
	idempotencyKey     string
	withIdempotencyKey bool
	// waitTemplate waits for a template that is being built (its first use).
	waitTemplate bool
}

// register adds the flags. The sandbox's time to live is --ttl: --timeout
// is a command's timeout (exec, run).
func (f *createFlags) register(cmd *cobra.Command, idempotency bool) {
	fl := cmd.Flags()
	fl.StringVar(&f.template, "template", "", "template name or name@version (server default: base)")
	fl.StringVar(&f.runtime, "runtime", "", "runtime: runc, gvisor or microvm (server default)")
	fl.Float64Var(&f.cpu, "cpu", 0, "CPUs, e.g. 0.5")
	fl.StringVar(&f.memory, "memory", "", "memory limit, e.g. 512M or 2G")
	fl.StringVar(&f.disk, "disk", "", "disk size of the writable layer, e.g. 1G")
	fl.StringVar(&f.ttl, "ttl", "", "sandbox time to live, e.g. 300 or 10m (server default 300 s)")
	fl.StringArrayVarP(&f.env, "env", "e", nil, "environment variable KEY=VALUE for every command (repeatable)")
	fl.StringArrayVar(&f.secrets, "secret", nil, "secret NAME=VALUE, or NAME to take $NAME of this shell: an environment variable of every command, masked in output and files (repeatable; a VALUE on the command line is visible in ps and shell history)")
	fl.StringArrayVar(&f.meta, "meta", nil, "metadata KEY=VALUE (repeatable)")
	fl.StringVar(&f.network, "network", "", "network mode: none, allowlist or open (server default: none)")
	fl.StringArrayVar(&f.allow, "allow", nil, "with --network allowlist: a domain or CIDR[:port] to allow (repeatable)")
	fl.BoolVar(&f.waitTemplate, "wait-template", true, "wait for a template that is being built (its first use), showing its build's log; false: fail at once (template_building)")
	if idempotency {
		f.withIdempotencyKey = true
		fl.StringVar(&f.idempotencyKey, "idempotency-key", "", "retry-safe creation: the same key returns the same sandbox")
	}
}

// request builds the create request; getenv gives the values of secrets
// named without one.
func (f *createFlags) request(getenv func(string) string) (api.CreateSandboxRequest, error) {
	req := api.CreateSandboxRequest{Template: f.template, Runtime: f.runtime}
	var res api.Resources
	if f.cpu < 0 {
		return req, usagef("--cpu must be positive")
	}
	res.CPU = f.cpu
	var err error
	if f.memory != "" {
		if res.MemoryMB, err = parseSizeMB("memory", f.memory); err != nil {
			return req, err
		}
	}
	if f.disk != "" {
		if res.DiskMB, err = parseSizeMB("disk", f.disk); err != nil {
			return req, err
		}
	}
	if res != (api.Resources{}) {
		req.Resources = &res
	}
	if f.ttl != "" {
		s, err := parseSeconds("ttl", f.ttl)
		if err != nil {
			return req, err
		}
		ttl := int64(math.Ceil(s))
		req.TimeoutS = &ttl
	}
	if req.Env, err = parseKV("env", f.env); err != nil {
		return req, err
	}
	if req.Metadata, err = parseKV("meta", f.meta); err != nil {
		return req, err
	}
	if req.Secrets, err = parseSecrets(f.secrets, getenv); err != nil {
		return req, err
	}
	if f.network != "" || len(f.allow) > 0 {
		req.Network = &api.Network{Mode: f.network, Allow: f.allow}
	}
	return req, nil
}

// newIdempotencyKey returns a random key so that a create retried by the
// CLI itself cannot make two sandboxes.
func newIdempotencyKey() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
	return "cli-" + hex.EncodeToString(b)
}

// execFlags are the command settings of `exec` and `run`.
type execFlags struct {
	shell   string
	user    string
	cwd     string
	timeout string
	env     []string
	stdin   bool
}

func (f *execFlags) register(cmd *cobra.Command, withEnv bool) {
	fl := cmd.Flags()
	fl.StringVar(&f.shell, "shell", "", "run this string with /bin/sh -c instead of an argv after --")
	fl.StringVar(&f.user, "user", "", "user inside the sandbox: user (default) or root")
	fl.StringVar(&f.cwd, "cwd", "", "working directory (default the user's home)")
	fl.BoolVarP(&f.stdin, "interactive", "i", false, "stream this process's stdin to the command (default: empty stdin)")
	fl.StringVar(&f.timeout, "timeout", "", "command timeout, e.g. 30 or 2m (enforced by the server)")
	if withEnv {
		fl.StringArrayVarP(&f.env, "env", "e", nil, "environment variable KEY=VALUE (repeatable)")
	}
}

// request builds the exec request for argv (empty when --shell is used).
func (f *execFlags) request(argv []string) (api.ExecRequest, error) {
	req := api.ExecRequest{Cwd: f.cwd, User: f.user}
	switch {
	case f.shell != "" && len(argv) > 0:
		return req, usagef("give either --shell or a command after --, not both")
	case f.shell != "":
		sh := f.shell
		req.Shell = &sh
	case len(argv) > 0:
		req.Cmd = argv
	default:
		return req, usagef("missing command: add -- CMD ARGS… or --shell 'CMD'")
	}
	if f.timeout != "" {
		s, err := parseSeconds("timeout", f.timeout)
		if err != nil {
			return req, err
		}
		req.TimeoutS = &s
	}
	env, err := parseKV("env", f.env)
	if err != nil {
		return req, err
	}
	req.Env = env
	return req, nil
}

// stdinReader is the stdin to stream to the command: in with -i, else nil.
func (f *execFlags) stdinReader(in io.Reader) io.Reader {
	if f.stdin {
		return in
	}
	return nil
}

// splitDash splits cobra args into the ones before `--` and the command after.
func splitDash(cmd *cobra.Command, args []string) (before, after []string) {
	if i := cmd.ArgsLenAtDash(); i >= 0 {
		return args[:i], args[i:]
	}
	return args, nil
}
