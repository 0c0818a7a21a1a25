package cli

import (
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/client"
)

// snapshotCommands are `airlock snapshot` (create, ls, info, rm), `airlock
// fork` and `airlock reset` (docs/snapshots.md).
func (a *app) snapshotCommands() []*cobra.Command {
	cmd := &cobra.Command{
		Use:   "snapshot",
		Short: "Snapshot sandboxes, list and delete snapshots",
		Long: `A snapshot is a sandbox's filesystem (and, where the runtime can, its memory) at one
instant, stored as one layer over its template's. Start a sandbox from one with
POST /v1/sandboxes {"snapshot": "snap_…"}, return a sandbox to one with
airlock reset SANDBOX --snapshot SNAP.`,
	}
	cmd.AddCommand(a.newSnapshotCreateCmd(), a.newSnapshotLsCmd(), a.newSnapshotInfoCmd(), a.newSnapshotRmCmd())
	return []*cobra.Command{cmd, a.newForkCmd(), a.newResetCmd()}
}

func (a *app) newSnapshotCreateCmd() *cobra.Command {
	var (
		name   string
		memory bool
	)
	cmd := &cobra.Command{
		Use:   "create SANDBOX",
		Short: "Snapshot a sandbox (it is frozen for the copy and runs on)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			s, err := c.CreateSnapshot(cmd.Context(), args[0], api.CreateSnapshotRequest{Name: name, Memory: memory})
			if err != nil {
				return err
			}
			return a.printSnapshot(s)
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "a name, unique among the tenant's snapshots")
	cmd.Flags().BoolVar(&memory, "memory", false, "include the processes and their memory (only where the runtime can: gVisor)")
	return cmd
}

func (a *app) newSnapshotLsCmd() *cobra.Command {
	var (
		sandboxID, name string
		limit           int
	)
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List snapshots, newest first",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			all := []api.Snapshot{}
			for s, err := range c.AllSnapshots(cmd.Context(), client.SnapshotListOptions{SandboxID: sandboxID, Name: name}) {
				if err != nil {
					return err
				}
				all = append(all, s)
				if limit > 0 && len(all) >= limit {
					break
				}
			}
			if a.output == "json" {
				return printJSON(a.stdout, all)
			}
			now := time.Now()
			t := newTable(a.stdout, "ID", "NAME", "SANDBOX", "TEMPLATE", "RUNTIME", "MEMORY", "SIZE", "CREATED")
			for _, s := range all {
				t.row(s.ID, s.Name, s.SandboxID, s.Template+"@"+strconv.Itoa(s.TemplateVersion), s.Runtime,
					strconv.FormatBool(s.Memory), humanBytes(uint64(max(s.SizeBytes, 0))), ago(s.CreatedAt, now))
			}
			return t.flush()
		},
	}
	cmd.Flags().StringVar(&sandboxID, "sandbox", "", "only the snapshots of this sandbox")
	cmd.Flags().StringVar(&name, "name", "", "only the snapshot of this name")
	cmd.Flags().IntVar(&limit, "limit", 0, "show at most this many")
	return cmd
}

func (a *app) newSnapshotInfoCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "info SNAPSHOT",
		Aliases: []string{"get"},
		Short:   "Show a snapshot",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			s, err := c.GetSnapshot(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return a.printSnapshot(s)
		},
	}
}

func (a *app) newSnapshotRmCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "rm SNAPSHOT…",
		Aliases: []string{"delete"},
		Short:   "Delete snapshots (sandboxes started from them run on)",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			deleted := []string{}
			for _, id := range args {
				if err := c.DeleteSnapshot(cmd.Context(), id); err != nil {
					return err
				}
				deleted = append(deleted, id)
				if a.output != "json" {
					fmt.Fprintln(a.stdout, id)
				}
			}
			if a.output == "json" {
				return printJSON(a.stdout, map[string][]string{"deleted": deleted})
			}
			return nil
		},
	}
}

func (a *app) printSnapshot(s *api.Snapshot) error {
	if a.output == "json" {
		return printJSON(a.stdout, s)
	}
	now := time.Now()
	mem := ""
	if s.Memory {
		mem = humanBytes(uint64(max(s.MemoryBytes, 0)))
	}
	return kvTable(a.stdout, [][2]string{
		{"id", s.ID},
		{"name", s.Name},
		{"state", s.State},
		{"tenant", s.Tenant},
		{"sandbox", s.SandboxID},
		{"parent", s.ParentID},
		{"template", fmt.Sprintf("%s@%d", s.Template, s.TemplateVersion)},
		{"runtime", s.Runtime},
		{"memory", mem},
		{"size", humanBytes(uint64(max(s.SizeBytes, 0)))},
		{"layers", strconv.Itoa(s.Layers)},
		{"created", s.CreatedAt.Format(time.RFC3339) + " (" + ago(s.CreatedAt, now) + ")"},
	})
}

func (a *app) newForkCmd() *cobra.Command {
	var (
		count         int
		secrets, meta []string
	)
	cmd := &cobra.Command{
		Use:   "fork SANDBOX",
		Short: "Make running copies of a sandbox (all or none)",
		Long: `Each copy is a new sandbox of the same tenant with the parent's files (and, where the
runtime can, its processes), its own id, network namespace and quota charge, and only
the secrets given here.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sec, err := parseSecrets(secrets, a.getenv)
			if err != nil {
				return err
			}
			md, err := parseKV("meta", meta)
			if err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			res, err := c.Fork(cmd.Context(), args[0], api.ForkRequest{Count: count, Secrets: sec, Metadata: md})
			if err != nil {
				return err
			}
			if a.output == "json" {
				return printJSON(a.stdout, res)
			}
			for _, s := range res.Sandboxes {
				fmt.Fprintln(a.stdout, s.ID)
			}
			return nil
		},
	}
	cmd.Flags().IntVarP(&count, "count", "n", 1, "how many copies")
	cmd.Flags().StringArrayVar(&secrets, "secret", nil, "a secret of the copies, NAME=VALUE or NAME for $NAME (repeatable; the parent's are never copied)")
	cmd.Flags().StringArrayVar(&meta, "meta", nil, "the copies' metadata KEY=VALUE instead of the parent's (repeatable)")
	return cmd
}

func (a *app) newResetCmd() *cobra.Command {
	var snapshot string
	cmd := &cobra.Command{
		Use:   "reset SANDBOX",
		Short: "Return a sandbox to its template or a snapshot, in place",
		Long: `Every process is killed and the filesystem's changes are dropped; the id, network,
secrets, env, metadata and expiry stay.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			s, err := c.Reset(cmd.Context(), args[0], api.ResetRequest{Snapshot: snapshot})
			if err != nil {
				return err
			}
			return a.printSandbox(s)
		},
	}
	cmd.Flags().StringVar(&snapshot, "snapshot", "", "the snapshot (snap_…) to return to; default the sandbox's template")
	return cmd
}
