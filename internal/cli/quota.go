package cli

import (
	"fmt"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/airlockhq/airlock/api"
)

func (a *app) newQuotaCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "quota",
		Aliases: []string{"quotas"},
		Short:   "Show and set tenant quotas (set and reset need an admin key)",
		Args:    cobra.ArbitraryArgs,
		RunE:    groupRunE,
	}
	cmd.AddCommand(a.newQuotaGetCmd(), a.newQuotaSetCmd(), a.newQuotaResetCmd())
	return cmd
}

func (a *app) newQuotaGetCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "get TENANT",
		Aliases: []string{"show"},
		Short:   "Show a tenant's quota and its usage now",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			q, err := c.TenantQuotas(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return a.printQuotas(q)
		},
	}
}

func (a *app) newQuotaSetCmd() *cobra.Command {
	var (
		sandboxes     int
		cpu           float64
		memMB, diskMB int64
		execs         int64
	)
	cmd := &cobra.Command{
		Use:   "set TENANT [--sandboxes N] [--cpu N] [--memory-mb N] [--disk-mb N] [--execs-per-minute N]",
		Short: "Replace a tenant's quota override (flags not given keep the server's default; 0 means no limit)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var o api.QuotaOverride
			f := cmd.Flags()
			if f.Changed("sandboxes") {
				o.Sandboxes = &sandboxes
			}
			if f.Changed("cpu") {
				o.CPU = &cpu
			}
			if f.Changed("memory-mb") {
				o.MemoryMB = &memMB
			}
			if f.Changed("disk-mb") {
				o.DiskMB = &diskMB
			}
			if f.Changed("execs-per-minute") {
				o.ExecsPerMinute = &execs
			}
			if o == (api.QuotaOverride{}) {
				return usagef("give at least one quota flag (or use `airlock quota reset %s`)", args[0])
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			q, err := c.SetTenantQuotas(cmd.Context(), args[0], o)
			if err != nil {
				return err
			}
			return a.printQuotas(q)
		},
	}
	cmd.Flags().IntVar(&sandboxes, "sandboxes", 0, "live sandboxes")
	cmd.Flags().Float64Var(&cpu, "cpu", 0, "summed vCPUs of live sandboxes")
	cmd.Flags().Int64Var(&memMB, "memory-mb", 0, "summed memory of live sandboxes, MiB")
	cmd.Flags().Int64Var(&diskMB, "disk-mb", 0, "summed disk of live sandboxes, MiB")
	cmd.Flags().Int64Var(&execs, "execs-per-minute", 0, "execs started in any 60 seconds")
	return cmd
}

func (a *app) newQuotaResetCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "reset TENANT",
		Aliases: []string{"rm", "clear"},
		Short:   "Remove a tenant's quota override (the server's default applies again)",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			if err := c.ClearTenantQuotas(cmd.Context(), args[0]); err != nil {
				return err
			}
			if a.output != "json" {
				return nil
			}
			// What applies now: the server's defaults.
			q, err := c.TenantQuotas(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return printJSON(a.stdout, q)
		},
	}
}

// printQuotas prints one row per quota: what is used, the limit, and
// whether the limit is the default or the tenant's own.
func (a *app) printQuotas(q *api.TenantQuotas) error {
	if a.output == "json" {
		return printJSON(a.stdout, q)
	}
	var o api.QuotaOverride
	if q.Override != nil {
		o = *q.Override
	}
	limit := func(v float64) string {
		if v == 0 {
			return "none"
		}
		return strconv.FormatFloat(v, 'f', -1, 64)
	}
	source := func(set bool) string {
		if set {
			return "tenant"
		}
		return "default"
	}
	fmt.Fprintf(a.stderr, "tenant %s\n", q.Tenant)
	t := newTable(a.stdout, "QUOTA", "USED", "LIMIT", "FROM")
	t.row("sandboxes", strconv.Itoa(q.Usage.Sandboxes), limit(float64(q.Quota.Sandboxes)), source(o.Sandboxes != nil))
	t.row("cpu", strconv.FormatFloat(q.Usage.CPU, 'f', -1, 64), limit(q.Quota.CPU), source(o.CPU != nil))
	t.row("memory_mb", strconv.FormatInt(q.Usage.MemoryMB, 10), limit(float64(q.Quota.MemoryMB)), source(o.MemoryMB != nil))
	t.row("disk_mb", strconv.FormatInt(q.Usage.DiskMB, 10), limit(float64(q.Quota.DiskMB)), source(o.DiskMB != nil))
	t.row("execs_per_minute", strconv.FormatInt(q.Usage.ExecsLastMinute, 10), limit(float64(q.Quota.ExecsPerMinute)), source(o.ExecsPerMinute != nil))
	return t.flush()
}
