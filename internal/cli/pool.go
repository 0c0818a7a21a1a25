package cli

import (
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/client"
)

// poolCommands are `airlock pool` (warm pools, docs/pools.md).
func (a *app) poolCommands() []*cobra.Command {
	cmd := &cobra.Command{
		Use:     "pool",
		Aliases: []string{"pools"},
		Short:   "Keep warm pools of ready sandboxes: a create that matches one answers in milliseconds",
		Args:    cobra.ArbitraryArgs,
		RunE:    groupRunE,
	}
	var tenant string
	cmd.PersistentFlags().StringVar(&tenant, "tenant", "", "the tenant whose pools (admin keys only)")
	opts := func() client.PoolOptions { return client.PoolOptions{Tenant: tenant} }
	cmd.AddCommand(a.newPoolPutCmd(opts), a.newPoolListCmd(opts), a.newPoolGetCmd(opts), a.newPoolDeleteCmd(opts))
	return []*cobra.Command{cmd}
}

func (a *app) newPoolPutCmd(opts func() client.PoolOptions) *cobra.Command {
	var (
		req           api.PutPoolRequest
		res           api.Resources
		memMB, diskMB int64
	)
	cmd := &cobra.Command{
		Use:   "put NAME --template T [--size N] [--runtime R] [--cpu N] [--memory-mb N] [--disk-mb N] [--pids N]",
		Short: "Create a warm pool or replace its template, runtime, resources and size (size 0 drains it)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if req.Template == "" {
				return usagef("--template is required")
			}
			if req.Size < 0 {
				return usagef("--size must not be negative")
			}
			res.MemoryMB, res.DiskMB = memMB, diskMB
			if res != (api.Resources{}) {
				req.Resources = &res
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			p, err := c.PutPool(cmd.Context(), args[0], req, opts())
			if err != nil {
				return err
			}
			return a.printPool(p)
		},
	}
	f := cmd.Flags()
	f.StringVar(&req.Template, "template", "", "template name or name@version of the members")
	f.StringVar(&req.Runtime, "runtime", "", "runtime of the members (the server's default when empty)")
	f.IntVar(&req.Size, "size", 1, "how many ready members the pool keeps")
	f.Float64Var(&res.CPU, "cpu", 0, "vCPUs of each member")
	f.Int64Var(&memMB, "memory-mb", 0, "memory of each member, MiB")
	f.Int64Var(&diskMB, "disk-mb", 0, "disk of each member, MiB")
	f.Int64Var(&res.PIDs, "pids", 0, "process limit of each member")
	return cmd
}

func (a *app) newPoolListCmd(opts func() client.PoolOptions) *cobra.Command {
	return &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List warm pools with their ready, starting and claimed members",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			pools, err := c.Pools(cmd.Context(), opts())
			if err != nil {
				return err
			}
			if a.output == "json" {
				return printJSON(a.stdout, api.PoolList{Pools: pools})
			}
			t := newTable(a.stdout, "TENANT", "NAME", "TEMPLATE", "RUNTIME", "SIZE", "READY", "STARTING", "CLAIMED", "ERROR")
			for _, p := range pools {
				t.row(p.Tenant, p.Name, p.Template, p.Runtime, strconv.Itoa(p.Size), strconv.Itoa(p.Status.Ready),
					strconv.Itoa(p.Status.Starting), strconv.Itoa(p.Status.Claimed), p.Status.Error)
			}
			return t.flush()
		},
	}
}

func (a *app) newPoolGetCmd(opts func() client.PoolOptions) *cobra.Command {
	return &cobra.Command{
		Use:     "get NAME",
		Aliases: []string{"show"},
		Short:   "Show a warm pool and its members' status",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			p, err := c.Pool(cmd.Context(), args[0], opts())
			if err != nil {
				return err
			}
			return a.printPool(p)
		},
	}
}

func (a *app) newPoolDeleteCmd(opts func() client.PoolOptions) *cobra.Command {
	return &cobra.Command{
		Use:     "delete NAME",
		Aliases: []string{"rm"},
		Short:   "Delete a warm pool (its unclaimed members are removed; claimed sandboxes keep running)",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			if err := c.DeletePool(cmd.Context(), args[0], opts()); err != nil {
				return err
			}
			if a.output == "json" {
				return printJSON(a.stdout, map[string]any{"name": args[0], "deleted": true})
			}
			return nil
		},
	}
}

func (a *app) printPool(p *api.Pool) error {
	if a.output == "json" {
		return printJSON(a.stdout, p)
	}
	r := p.Resources
	return kvTable(a.stdout, [][2]string{
		{"name", p.Name},
		{"tenant", p.Tenant},
		{"template", p.Template},
		{"runtime", p.Runtime},
		{"resources", fmt.Sprintf("cpu=%g memory_mb=%d disk_mb=%d pids=%d", r.CPU, r.MemoryMB, r.DiskMB, r.PIDs)},
		{"size", strconv.Itoa(p.Size)},
		{"ready", strconv.Itoa(p.Status.Ready)},
		{"starting", strconv.Itoa(p.Status.Starting)},
		{"claimed", strconv.Itoa(p.Status.Claimed)},
		{"error", p.Status.Error},
		{"updated", p.UpdatedAt.Local().Format(time.RFC3339)},
	})
}
