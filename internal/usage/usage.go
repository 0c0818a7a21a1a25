// Package usage turns sampled sandbox resource use into metered quantities, prices them and groups them for reports.
//
// Metering is interval based: each sample of a sandbox accounts the time
// since the previous one (store.AccrueUsage keeps that point durable), in
// the state the sandbox was in. Allocations (vCPU, memory, disk) are limit
// times time; cpu used and egress are deltas of the sandbox's counters.
package usage

import (
	"sort"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/config"
	"github.com/airlockhq/airlock/internal/store"
)

const gib = 1 << 30

// Limits are the allocated resources a sandbox is billed for.
type Limits struct {
	CPU      float64
	MemoryMB int64
	DiskMB   int64
}

// Interval returns the quantities of d spent in a state: running (with
// allocations), paused (disk only) or anything else (nothing). cpuDelta
// and txDelta are the counters' growth over the interval.
func Interval(running, paused bool, lim Limits, d time.Duration, cpuDelta float64, txDelta uint64) store.UsageQuantities {
	s := d.Seconds()
	if s <= 0 || (!running && !paused) {
		return store.UsageQuantities{}
	}
	q := store.UsageQuantities{
		DiskGiBH:    float64(lim.DiskMB) / 1024 * s / 3600,
		VCPUUsedS:   max(cpuDelta, 0),
		EgressBytes: float64(txDelta),
	}
	if running {
		q.RunningS = s
		q.VCPUAllocS = lim.CPU * s
		q.MemGiBS = float64(lim.MemoryMB) / 1024 * s
	} else {
		q.PausedS = s
	}
	return q
}

// Delta is the growth of a cumulative counter from prev to cur. A counter
// that went backwards was reset (a new cgroup or interface), so all of cur
// is new.
func Delta[T float64 | uint64](prev, cur T) T {
	if cur < prev {
		return cur
	}
	return cur - prev
}

// Amounts converts stored quantities to the API's, priced by p.
func Amounts(q store.UsageQuantities, p config.Prices) api.UsageAmounts {
	a := api.UsageAmounts{
		RunningS: q.RunningS, PausedS: q.PausedS, PausedDiskS: q.PausedDiskS, VCPUAllocatedS: q.VCPUAllocS, VCPUUsedS: q.VCPUUsedS,
		MemoryGiBS: q.MemGiBS, DiskGiBHours: q.DiskGiBH, EgressBytes: q.EgressBytes,
	}
	a.Cost = q.VCPUAllocS*p.VCPUSecond + q.MemGiBS*p.GiBSecond + q.DiskGiBH*p.DiskGiBHour +
		q.EgressBytes/gib*p.EgressGiB + q.RunningS*p.SandboxSecond
	return a
}

// Report groups rows by groupBy (sandbox, template or day; "" is sandbox)
// and prices each group and the total. Groups are sorted by tenant, key.
func Report(rows []store.UsageRow, groupBy string, p config.Prices) api.UsageReport {
	if groupBy == "" {
		groupBy = api.UsageBySandbox
	}
	type key struct{ tenant, k string }
	sums := map[key]store.UsageQuantities{}
	var total store.UsageQuantities
	for _, r := range rows {
		var k string
		switch groupBy {
		case api.UsageByTemplate:
			k = r.Template
		case api.UsageByDay:
			k = r.Hour.UTC().Format(time.DateOnly)
		default:
			k = r.SandboxID
		}
		kk := key{r.Tenant, k}
		sums[kk] = sums[kk].Add(r.Q)
		total = total.Add(r.Q)
	}
	out := api.UsageReport{GroupBy: groupBy, Groups: make([]api.UsageGroup, 0, len(sums)), Total: Amounts(total, p)}
	for k, q := range sums {
		out.Groups = append(out.Groups, api.UsageGroup{Key: k.k, Tenant: k.tenant, UsageAmounts: Amounts(q, p)})
	}
	sort.Slice(out.Groups, func(i, j int) bool {
		a, b := out.Groups[i], out.Groups[j]
		if a.Tenant != b.Tenant {
			return a.Tenant < b.Tenant
		}
		return a.Key < b.Key
	})
	return out
}
