package cli

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/client"
)

func (a *app) newSandboxCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "sandbox",
		Aliases: []string{"sandboxes", "sbx"},
		Short:   "Create, list, inspect and delete sandboxes",
		Args:    cobra.ArbitraryArgs,
		RunE:    groupRunE,
	}
	cmd.AddCommand(
		a.newSandboxCreateCmd(),
		a.newSandboxLsCmd(),
		a.newSandboxInfoCmd(),
		a.newSandboxRmCmd(),
		a.newSandboxStateCmd("pause", "Pause a sandbox: freeze its processes in RAM, or with --disk release its RAM (its timeout stops counting)"),
		a.newSandboxStateCmd("resume", "Run a paused sandbox again"),
		a.newSandboxKeepaliveCmd(),
		a.newSandboxTimeoutCmd(),
		a.newSandboxMetricsCmd(),
		a.newSandboxNetworkCmd(),
	)
	return cmd
}

// netFlags are the egress settings beyond --network and --allow (which
// createFlags has): package registry sets and offline mode.
type netFlags struct {
	registries []string
	offline    bool
}

func (n *netFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringArrayVar(&n.registries, "registry", nil, "with --network allowlist: a package registry set to allow: debian, pypi, npm or goproxy (repeatable)")
	cmd.Flags().BoolVar(&n.offline, "offline", false, "package registries answer no such host at once (installs fail fast)")
}

// apply adds the flags to req's network.
func (n *netFlags) apply(req *api.CreateSandboxRequest) {
	if len(n.registries) == 0 && !n.offline {
		return
	}
	if req.Network == nil {
		req.Network = &api.Network{}
	}
	req.Network.Registries, req.Network.Offline = n.registries, n.offline
}

func (a *app) newSandboxNetworkCmd() *cobra.Command {
	var (
		mode  string
		allow []string
		nf    netFlags
	)
	cmd := &cobra.Command{
		Use:   "network SANDBOX --network MODE [--allow ENTRY…]",
		Short: "Change a running sandbox's egress policy (effective at once)",
		Example: `  airlock sandbox network sbx_… --network allowlist --allow pypi.org --allow '*.github.com'
  airlock sandbox network sbx_… --network none`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if mode == "" {
				return usagef("--network is required: none, allowlist or open")
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			s, err := c.UpdateNetwork(cmd.Context(), args[0], api.Network{Mode: mode, Allow: allow, Registries: nf.registries, Offline: nf.offline})
			if err != nil {
				return err
			}
			if a.output == "json" {
				return printJSON(a.stdout, s)
			}
			_, err = fmt.Fprintf(a.stdout, "%s network %s\n", s.ID, networkText(s.Network))
			return err
		},
	}
	cmd.Flags().StringVar(&mode, "network", "", "network mode: none, allowlist or open")
	cmd.Flags().StringArrayVar(&allow, "allow", nil, "a domain, *.domain or CIDR[:port] to allow (repeatable)")
	nf.register(cmd)
	return cmd
}

// networkText renders a policy on one line.
func networkText(n api.Network) string {
	s := n.Mode
	if len(n.Allow) > 0 {
		s += " allow=" + strings.Join(n.Allow, ",")
	}
	if len(n.Registries) > 0 {
		s += " registries=" + strings.Join(n.Registries, ",")
	}
	if n.Offline {
		s += " offline"
	}
	return s
}

func (a *app) newSandboxCreateCmd() *cobra.Command {
	var (
		f          createFlags
		nf         netFlags
		lf         lifecycleFlags
		oldTimeout string
	)
	cmd := &cobra.Command{
		Use:   "create",
		Short: "Create a sandbox and print its id once it is ready",
		Long: `Create a sandbox and print its id once it is ready (with -o json, the sandbox).
A template that is being built (the first use of python or code-interpreter
builds it, for a few minutes) is waited for, its build's log shown on stderr;
--wait-template=false fails at once with template_building instead.
Ctrl-C deletes the sandbox once its create answered.`,
		Args: cobra.NoArgs,
		Example: `  airlock sandbox create --template base --memory 1G --ttl 10m --meta user=u-42
  airlock sandbox create --secret OPENAI_API_KEY -e MODE=test   # the secret from this shell's $OPENAI_API_KEY
  SBX=$(airlock sandbox create) && airlock exec "$SBX" -- uname -a`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cmd.Flags().Changed("timeout") {
				// --timeout is a command's timeout everywhere else.
				if cmd.Flags().Changed("ttl") && oldTimeout != f.ttl {
					return usagef("--timeout is the old name of --ttl: give --ttl alone")
				}
				fmt.Fprintln(a.stderr, "airlock: sandbox create --timeout is deprecated: use --ttl (the sandbox's time to live)")
				f.ttl = oldTimeout
			}
			req, err := f.request(a.getenv)
			if err != nil {
				return err
			}
			nf.apply(&req)
			if err := lf.apply(cmd, &req); err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			var opts []client.CallOption
			if f.idempotencyKey != "" {
				opts = append(opts, client.WithIdempotencyKey(f.idempotencyKey))
			}
			sbx, aborted, err := a.createSandbox(cmd.Context(), c, req, f.waitTemplate, opts...)
			if err != nil {
				return err
			}
			if aborted {
				if sbx != nil {
					a.deleteQuietly(cmd.Context(), c, sbx.ID)
				}
				return exitCodeError{exitInterrupted}
			}
			if a.output == "json" {
				return printJSON(a.stdout, sbx)
			}
			// Only the id, so that scripts can capture it.
			_, err = fmt.Fprintln(a.stdout, sbx.ID)
			return err
		},
	}
	f.register(cmd, true)
	cmd.Flags().StringVar(&oldTimeout, "timeout", "", "deprecated: --ttl")
	_ = cmd.Flags().MarkHidden("timeout")
	nf.register(cmd)
	lf.register(cmd)
	return cmd
}

func (a *app) newSandboxLsCmd() *cobra.Command {
	var (
		state string
		meta  []string
		limit int
	)
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List sandboxes",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			md, err := parseKV("meta", meta)
			if err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			var all []api.Sandbox
			for s, err := range c.Sandboxes(cmd.Context(), client.ListOptions{State: state, Metadata: md}) {
				if err != nil {
					return err
				}
				all = append(all, s)
				if limit > 0 && len(all) >= limit {
					break
				}
			}
			if a.output == "json" {
				if all == nil {
					all = []api.Sandbox{}
				}
				return printJSON(a.stdout, all)
			}
			now := time.Now()
			t := newTable(a.stdout, "ID", "STATE", "TEMPLATE", "RUNTIME", "CREATED", "EXPIRES", "METADATA")
			for _, s := range all {
				tpl := s.Template
				if s.TemplateVersion > 0 {
					tpl += "@" + strconv.Itoa(s.TemplateVersion)
				}
				t.row(s.ID, s.State, tpl, s.Runtime, ago(s.CreatedAt, now), in(s.ExpiresAt, now), formatMap(s.Metadata))
			}
			return t.flush()
		},
	}
	cmd.Flags().StringVar(&state, "state", "", "only sandboxes in this state (running, paused, …)")
	cmd.Flags().StringArrayVar(&meta, "meta", nil, "only sandboxes with metadata KEY=VALUE (repeatable)")
	cmd.Flags().IntVar(&limit, "limit", 0, "show at most this many")
	return cmd
}

func (a *app) newSandboxInfoCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "info SANDBOX",
		Short: "Show a sandbox",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			s, err := c.GetSandbox(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return a.printSandbox(s)
		},
	}
}

func (a *app) printSandbox(s *api.Sandbox) error {
	if a.output == "json" {
		return printJSON(a.stdout, s)
	}
	now := time.Now()
	var expires string
	if s.ExpiresAt != nil {
		expires = s.ExpiresAt.Format(time.RFC3339) + " (" + in(s.ExpiresAt, now) + ")"
	}
	var res string
	if r := s.Resources; r != (api.Resources{}) {
		res = fmt.Sprintf("cpu=%g memory=%dMiB disk=%dMiB pids=%d", r.CPU, r.MemoryMB, r.DiskMB, r.PIDs)
	}
	var errText string
	if s.Error != nil {
		errText = s.Error.Message + " (" + s.Error.Code + ")"
	}
	net := networkText(s.Network)
	var paused, lifecycle string
	if s.PausedAt != nil {
		paused = s.PausedAt.Format(time.RFC3339) + " (" + ago(*s.PausedAt, now) + ", memory " + s.PauseMemory + ")"
	}
	if l := s.Lifecycle; l != nil {
		lifecycle = "on_timeout=" + l.OnTimeout
		if l.AutoResume != nil && *l.AutoResume {
			lifecycle += " auto_resume"
		}
		if l.IdleTimeoutS != nil && *l.IdleTimeoutS > 0 {
			lifecycle += fmt.Sprintf(" idle_timeout=%ds", *l.IdleTimeoutS)
		}
	}
	var stopped string
	if s.StopReason != "" {
		stopped = s.StopReason
		if s.EndedAt != nil {
			stopped += " at " + s.EndedAt.Format(time.RFC3339)
		}
	}
	return kvTable(a.stdout, [][2]string{
		{"id", s.ID},
		{"state", s.State},
		{"paused", paused},
		{"stopped", stopped},
		{"error", errText},
		{"tenant", s.Tenant},
		{"template", fmt.Sprintf("%s@%d", s.Template, s.TemplateVersion)},
		{"runtime", s.Runtime},
		{"created", s.CreatedAt.Format(time.RFC3339) + " (" + ago(s.CreatedAt, now) + ")"},
		{"expires", expires},
		{"ready", fmt.Sprintf("%d ms", s.ReadyMS)},
		{"resources", res},
		{"network", net},
		{"lifecycle", lifecycle},
		{"metadata", formatMap(s.Metadata)},
	})
}

func (a *app) newSandboxRmCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "rm SANDBOX…",
		Aliases: []string{"delete", "kill"},
		Short:   "Delete sandboxes (every process, file and mount of them)",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			res := deleted{Deleted: []string{}}
			for _, id := range args {
				if err := c.DeleteSandbox(cmd.Context(), id); err != nil {
					// Go on with the others; report every failure.
					res.fail(a, id, err)
					continue
				}
				res.Deleted = append(res.Deleted, id)
				if a.output != "json" {
					fmt.Fprintln(a.stdout, id)
				}
			}
			return a.reportDeleted(res)
		},
	}
}

func (a *app) newSandboxStateCmd(verb, short string) *cobra.Command {
	var disk bool
	cmd := &cobra.Command{
		Use:   verb + " SANDBOX",
		Short: short,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			call := c.Resume
			if verb == "pause" {
				call = func(ctx context.Context, id string) (*api.Sandbox, error) {
					return c.PauseWith(ctx, id, client.PauseOptions{Disk: disk})
				}
			}
			s, err := call(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if a.output == "json" {
				return printJSON(a.stdout, s)
			}
			if s.PauseMemory != "" {
				_, err = fmt.Fprintf(a.stdout, "%s %s (memory %s)\n", s.ID, s.State, s.PauseMemory)
				return err
			}
			_, err = fmt.Fprintf(a.stdout, "%s %s\n", s.ID, s.State)
			return err
		},
	}
	if verb == "pause" {
		cmd.Long = `Pause a sandbox. By default every process is frozen in RAM: the resume takes
milliseconds. With --disk its RAM is released: on gVisor its processes are
checkpointed to disk and resume where they were; on runc only its files are
kept: its processes stop (running execs end killed) and the resume starts it
again on its files (the template's start command runs again).`
		cmd.Flags().BoolVar(&disk, "disk", false, "release the sandbox's RAM (pause_memory disk) instead of freezing it in RAM")
	}
	return cmd
}

func (a *app) newSandboxKeepaliveCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "keepalive SANDBOX",
		Short: "Count as activity of a sandbox for its idle timeout (its expiry does not move)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			s, err := c.Keepalive(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if a.output == "json" {
				return printJSON(a.stdout, s)
			}
			_, err = fmt.Fprintf(a.stdout, "%s %s\n", s.ID, s.State)
			return err
		},
	}
}

// lifecycleFlags are a create's lifecycle rules.
type lifecycleFlags struct {
	onTimeout   string
	idleTimeout string
	autoResume  bool
}

func (l *lifecycleFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&l.onTimeout, "on-timeout", "", "what the end of the TTL does: kill (default) or pause")
	cmd.Flags().StringVar(&l.idleTimeout, "idle-timeout", "", "pause the sandbox after this long without activity (seconds or a duration like 10m)")
	cmd.Flags().BoolVar(&l.autoResume, "auto-resume", false, "resume a paused sandbox on the next request to it")
}

// apply adds the rules given to req.
func (l *lifecycleFlags) apply(cmd *cobra.Command, req *api.CreateSandboxRequest) error {
	var lc api.Lifecycle
	set := false
	if l.onTimeout != "" {
		if l.onTimeout != api.OnTimeoutKill && l.onTimeout != api.OnTimeoutPause {
			return usagef("--on-timeout %q: want kill or pause", l.onTimeout)
		}
		lc.OnTimeout, set = l.onTimeout, true
	}
	if l.idleTimeout != "" {
		secs, err := parseSeconds("idle-timeout", l.idleTimeout)
		if err != nil {
			return err
		}
		n := int64(math.Ceil(secs))
		lc.IdleTimeoutS, set = &n, true
	}
	if cmd.Flags().Changed("auto-resume") {
		v := l.autoResume
		lc.AutoResume, set = &v, true
	}
	if set {
		req.Lifecycle = &lc
	}
	return nil
}

func (a *app) newSandboxTimeoutCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "timeout SANDBOX DURATION",
		Short: "Make a sandbox expire DURATION from now (e.g. 600 or 1h)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			secs, err := parseSeconds("timeout", args[1])
			if err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			s, err := c.SetTimeout(cmd.Context(), args[0], int64(secs+0.999))
			if err != nil {
				return err
			}
			if a.output == "json" {
				return printJSON(a.stdout, s)
			}
			if s.ExpiresAt != nil {
				_, err = fmt.Fprintf(a.stdout, "%s expires %s\n", s.ID, s.ExpiresAt.Format(time.RFC3339))
			}
			return err
		},
	}
}

func (a *app) newSandboxMetricsCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "metrics SANDBOX",
		Short: "Show a sandbox's resource use",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			m, err := c.Metrics(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if a.output == "json" {
				return printJSON(a.stdout, m)
			}
			return kvTable(a.stdout, [][2]string{
				{"cpu", fmt.Sprintf("%.2f s", m.CPUSeconds)},
				{"memory", bytesHuman(m.MemoryBytes) + " (peak " + bytesHuman(m.MemoryPeakBytes) + ")"},
				{"pids", strconv.FormatUint(m.PIDs, 10)},
				{"disk", bytesHuman(m.DiskBytes) + " (written " + bytesHuman(m.DiskWrittenBytes) + ")"},
				{"network", "rx " + bytesHuman(m.NetRxBytes) + ", tx " + bytesHuman(m.NetTxBytes)},
				{"uptime", fmt.Sprintf("%.0f s", m.UptimeS)},
			})
		},
	}
}

// deleted is what an rm of several things did (-o json prints it).
type deleted struct {
	Deleted []string     `json:"deleted"`
	Failed  []failedItem `json:"failed,omitempty"`
}

type failedItem struct {
	ID    string `json:"id"`
	Error any    `json:"error"`
}

// fail records that deleting id failed; without -o json it says so at once.
func (d *deleted) fail(a *app, id string, err error) {
	if a.output != "json" {
		fmt.Fprintf(a.stderr, "airlock: %s: %s\n", id, oneLine(err))
	}
	d.Failed = append(d.Failed, failedItem{ID: id, Error: errorJSON(err).Error})
}

// reportDeleted prints d with -o json; a failure exits 1 (each one was
// reported).
func (a *app) reportDeleted(d deleted) error {
	if a.output == "json" {
		if err := printJSON(a.stdout, d); err != nil {
			return err
		}
	}
	if len(d.Failed) > 0 {
		return exitCodeError{exitError}
	}
	return nil
}
