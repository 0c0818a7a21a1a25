package cli

import (
	"fmt"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/client"
)

func (a *app) newUsageCmd() *cobra.Command {
	var (
		opts     client.UsageOptions
		from, to string
	)
	cmd := &cobra.Command{
		Use:   "usage",
		Short: "Print metered usage and its cost",
		Long: `Print metered usage: running and paused sandbox-seconds, vCPU-seconds
allocated and used, memory GiB-seconds, disk GiB-hours and egress bytes, priced
by the daemon's price table. A tenant's key sees its tenant; an admin key sees
every tenant, or one with --tenant.`,
		Example: `  airlock usage --from 24h --group-by template
  airlock usage --from 2026-01-01T00:00:00Z --group-by day -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if opts.From, err = parseWhen("from", from); err != nil {
				return err
			}
			if opts.To, err = parseWhen("to", to); err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			rep, err := c.Usage(cmd.Context(), opts)
			if err != nil {
				return err
			}
			if a.output == "json" {
				return printJSON(a.stdout, rep)
			}
			t := newTable(a.stdout, "TENANT", "KEY", "RUNNING_S", "PAUSED_S", "VCPU_ALLOC_S", "VCPU_USED_S", "MEM_GIB_S", "DISK_GIB_H", "EGRESS", "COST")
			row := func(tenant, key string, u api.UsageAmounts) {
				t.row(tenant, key, num(u.RunningS), num(u.PausedS), num(u.VCPUAllocatedS), num(u.VCPUUsedS),
					num(u.MemoryGiBS), num(u.DiskGiBHours), humanBytes(uint64(u.EgressBytes)), strconv.FormatFloat(u.Cost, 'f', 4, 64))
			}
			for _, g := range rep.Groups {
				row(g.Tenant, g.Key, g.UsageAmounts)
			}
			row("", "TOTAL", rep.Total)
			return t.flush()
		},
	}
	f := cmd.Flags()
	f.StringVar(&from, "from", "", "start: RFC 3339, or a duration back from now (24h)")
	f.StringVar(&to, "to", "", "end: RFC 3339, or a duration back from now")
	f.StringVar(&opts.GroupBy, "group-by", "sandbox", "group by sandbox, template or day")
	f.StringVar(&opts.Tenant, "tenant", "", "admin keys: only this tenant")
	return cmd
}

func num(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) }

// humanBytes renders n with a binary unit.
func humanBytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%dB", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f%ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
