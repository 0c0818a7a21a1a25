package drivertest

import (
	"bufio"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/cgroups"
)

// cpuGroup is the host cgroup that holds a sandbox's CPU quota, read
// directly: what the kernel enforced, not what the sandbox got of a host
// that other work shares.
type cpuGroup struct {
	dir string
	v2  bool
}

// cpuStat is a sample of a cpuGroup.
type cpuStat struct {
	usage     time.Duration // CPU time used by the group
	periods   uint64        // CFS periods in which the group was runnable
	throttled uint64        // of those, the periods that hit the quota
}

// quotaGroup finds the cgroup of host process pid (the sandbox's init, or
// for gVisor its sandbox process) that carries a CPU quota: its own, or the
// nearest ancestor with one. It returns the group and the quota as a share
// of one CPU.
func quotaGroup(t *testing.T, pid int) (cpuGroup, float64) {
	t.Helper()
	h, err := cgroups.Load()
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var g cpuGroup
	var rel string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// hierarchy-id:controllers:path
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		if mnt := h.V1["cpu"]; mnt != "" {
			for _, c := range strings.Split(parts[1], ",") {
				if c == "cpu" {
					g.dir, rel = mnt, parts[2]
				}
			}
		} else if parts[0] == "0" && parts[1] == "" && h.Unified != "" {
			g.dir, rel, g.v2 = h.Unified, parts[2], true
		}
	}
	if g.dir == "" {
		t.Fatalf("no cpu cgroup for pid %d", pid)
	}
	for p := rel; ; p = path.Dir(p) {
		quota, period, ok := readQuota(t, filepath.Join(g.dir, p), g.v2)
		if ok {
			return cpuGroup{dir: filepath.Join(g.dir, p), v2: g.v2}, float64(quota) / float64(period)
		}
		if p == "/" || p == "." {
			t.Fatalf("no CPU quota on the cgroup of pid %d (%s) or above it", pid, rel)
		}
	}
}

// readQuota reads a group's CFS quota and period in µs; ok is false when it
// has none.
func readQuota(t *testing.T, dir string, v2 bool) (quota, period int64, ok bool) {
	t.Helper()
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if os.IsNotExist(err) {
			return "" // the v2 root has no cpu.max
		}
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	if v2 {
		q, p, _ := strings.Cut(read("cpu.max"), " ")
		if q == "max" || q == "" {
			return 0, 0, false
		}
		quota, _ = strconv.ParseInt(q, 10, 64)
		period, _ = strconv.ParseInt(p, 10, 64)
	} else {
		quota, _ = strconv.ParseInt(read("cpu.cfs_quota_us"), 10, 64)
		period, _ = strconv.ParseInt(read("cpu.cfs_period_us"), 10, 64)
	}
	return quota, period, quota > 0 && period > 0
}

// stat samples the group: usage from cpuacct.usage (v1, ns) or cpu.stat's
// usage_usec (v2), the CFS counters from cpu.stat.
func (g cpuGroup) stat(t *testing.T) cpuStat {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(g.dir, "cpu.stat"))
	if err != nil {
		t.Fatal(err)
	}
	var st cpuStat
	st.periods, _ = cgroups.ParseKeyed(b, "nr_periods")
	st.throttled, _ = cgroups.ParseKeyed(b, "nr_throttled")
	if g.v2 {
		us, _ := cgroups.ParseKeyed(b, "usage_usec")
		st.usage = time.Duration(us) * time.Microsecond
		return st
	}
	// cpuacct is co-mounted with cpu on v1 hosts (cpu,cpuacct); where it
	// is not, its own mount holds the same path.
	acct := filepath.Join(g.dir, "cpuacct.usage")
	if _, err := os.Stat(acct); err != nil {
		h, herr := cgroups.Load()
		if herr != nil || h.V1["cpuacct"] == "" {
			t.Fatalf("no cpuacct.usage for %s", g.dir)
		}
		rel, _ := filepath.Rel(h.V1["cpu"], g.dir)
		acct = filepath.Join(h.V1["cpuacct"], rel, "cpuacct.usage")
	}
	b, err = os.ReadFile(acct)
	if err != nil {
		t.Fatal(err)
	}
	ns, err := cgroups.ParseUint(b)
	if err != nil {
		t.Fatal(err)
	}
	st.usage = time.Duration(ns)
	return st
}
