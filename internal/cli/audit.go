package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/client"
)

// auditPoll is how often `audit --follow` asks for new events: often enough
// to feel live, rare enough to cost the server nothing.
const auditPoll = time.Second

func (a *app) newAuditCmd() *cobra.Command {
	var (
		opts         client.AuditOptions
		types        []string
		since, until string
		limit        int
		follow       bool
	)
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Print the audit trail (and follow it)",
		Long: `Print the audit trail: sandbox creates, execs, file writes, egress
(every DNS query and connection attempt, allowed or denied), network changes,
pauses, deletes, expiries, errors and authentication failures, oldest first.
A tenant's key sees its tenant's events; an admin key sees all.

With -o json every event is one JSON object per line (JSON lines), also
while following.`,
		Example: `  airlock audit --sandbox sbx_… --type egress
  airlock audit --since 10m --follow
  airlock audit --since 2026-01-02T00:00:00Z -o json > audit.jsonl`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if opts.Since, err = parseWhen("since", since); err != nil {
				return err
			}
			if opts.Until, err = parseWhen("until", until); err != nil {
				return err
			}
			if limit < 0 {
				return usagef("--limit must not be negative")
			}
			if follow && limit > 0 {
				return usagef("--follow and --limit do not go together")
			}
			for _, t := range types {
				for _, x := range strings.Split(t, ",") {
					if x = strings.TrimSpace(x); x != "" {
						opts.Types = append(opts.Types, x)
					}
				}
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			ctx, cancel := context.WithCancel(cmd.Context())
			defer cancel()
			var interrupted atomic.Bool
			if follow {
				// Ctrl-C ends the follow; what was printed stays printed.
				go func() {
					select {
					case <-a.interrupts:
						interrupted.Store(true)
						cancel()
					case <-ctx.Done():
					}
				}()
			}
			events := c.AuditEvents(ctx, opts)
			if follow {
				events = c.FollowAudit(ctx, opts, auditPoll)
			}
			n := 0
			for e, err := range events {
				if err != nil {
					return err
				}
				if err := a.printAuditEvent(e); err != nil {
					return err
				}
				n++
				if limit > 0 && n >= limit {
					break
				}
			}
			if interrupted.Load() {
				return exitCodeError{exitInterrupted}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.SandboxID, "sandbox", "", "only this sandbox's events")
	f.StringArrayVar(&types, "type", nil, "only events of this type (repeatable, or comma-separated): create, exec, file_write, egress, network_update, pause, resume, delete, expiry, error, auth_failure")
	f.StringVar(&since, "since", "", "only events since this time: RFC 3339, or a duration back from now (10m, 2h)")
	f.StringVar(&until, "until", "", "only events before this time: RFC 3339, or a duration back from now")
	f.StringVar(&opts.Tenant, "tenant", "", "admin keys: only this tenant's events")
	f.IntVar(&limit, "limit", 0, "print at most this many events")
	f.BoolVarP(&follow, "follow", "f", false, "keep printing new events as they happen (Ctrl-C ends)")
	return cmd
}

// parseWhen reads an RFC 3339 time or a duration back from now.
func parseWhen(flag, s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return time.Time{}, usagef("--%s %q: want an RFC 3339 time or a duration like 10m", flag, s)
	}
	return time.Now().Add(-d), nil
}

// printAuditEvent prints one event: a JSON line with -o json, else a line
// of time, type, sandbox, request and a summary of the detail.
func (a *app) printAuditEvent(e api.AuditEvent) error {
	if a.output == "json" {
		b, err := json.Marshal(e)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(a.stdout, "%s\n", b)
		return err
	}
	sbx := e.SandboxID
	if sbx == "" {
		sbx = "-"
	}
	req := e.RequestID
	if req == "" {
		req = "-"
	}
	line := fmt.Sprintf("%s  %-14s %-28s %-20s %s", e.Time.Local().Format("2006-01-02 15:04:05"), e.Type, sbx, req, auditSummary(e))
	// One event, one line: details are user input.
	line = strings.Map(func(r rune) rune {
		if r == '\n' || r == '\r' || r == '\t' {
			return ' '
		}
		return r
	}, line)
	_, err := fmt.Fprintln(a.stdout, strings.TrimRight(line, " "))
	return err
}

// auditSummary renders an event's detail in a few words.
func auditSummary(e api.AuditEvent) string {
	switch e.Type {
	case api.AuditExec:
		var d api.ExecAuditDetail
		if json.Unmarshal(e.Detail, &d) == nil {
			cmd := strings.Join(d.Cmd, " ")
			if d.Shell != nil {
				cmd = "sh -c " + *d.Shell
			}
			res := d.Status
			if d.ExitCode != nil {
				res = fmt.Sprintf("%s %d", d.Status, *d.ExitCode)
			}
			return fmt.Sprintf("%s: %s → %s (%d ms)", d.User, truncateText(cmd, 80), res, d.DurationMS)
		}
	case api.AuditEgress:
		var d api.EgressAuditDetail
		if json.Unmarshal(e.Detail, &d) == nil {
			verdict := "allowed"
			if !d.Allowed {
				verdict = "denied (" + d.Reason + ")"
			}
			dst := d.Domain
			if d.IP != "" {
				addr := d.IP
				if d.Port > 0 {
					addr = fmt.Sprintf("%s:%d", d.IP, d.Port)
				}
				if dst == "" {
					dst = addr
				} else {
					dst += " " + addr
				}
			}
			s := fmt.Sprintf("%s %s %s", d.Kind, dst, verdict)
			if d.BytesIn > 0 || d.BytesOut > 0 {
				s += fmt.Sprintf(" in %d B out %d B", d.BytesIn, d.BytesOut)
			}
			return s
		}
	case api.AuditFileWrite:
		var d api.FileAuditDetail
		if json.Unmarshal(e.Detail, &d) == nil {
			s := d.Op + " " + d.Path
			if d.To != "" {
				s += " → " + d.To
			}
			if d.Bytes > 0 {
				s += fmt.Sprintf(" (%d B)", d.Bytes)
			}
			if !d.OK {
				s += " failed: " + d.Code
			}
			return s
		}
	}
	return flatDetail(e.Detail)
}

// flatDetail renders a JSON object as sorted key=value pairs.
func flatDetail(raw json.RawMessage) string {
	var m map[string]any
	if json.Unmarshal(raw, &m) != nil {
		return string(raw)
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		v := m[k]
		var s string
		switch x := v.(type) {
		case string:
			s = x
		default:
			b, _ := json.Marshal(x)
			s = string(b)
		}
		parts = append(parts, k+"="+truncateText(s, 80))
	}
	return strings.Join(parts, " ")
}

func truncateText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
