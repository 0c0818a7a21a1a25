package oci

import (
	"context"
	"fmt"

	"github.com/airlockhq/airlock/internal/cgroups"
	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/storage"
)

// paths returns the cgroup and directory of sandbox id. They are read from
// its state file once and then kept with the in-memory record: Stats and
// OOMKills run around every exec, and neither path changes while the
// sandbox lives.
func (c *Core) paths(id string) (*cgroups.Group, string, error) {
	c.mu.Lock()
	if s := c.sandboxes[id]; s != nil && s.group != nil {
		g, dir := s.group, s.dir
		c.mu.Unlock()
		return g, dir, nil
	}
	c.mu.Unlock()
	st, err := loadState(c.Dir(id))
	if err != nil {
		return nil, "", err
	}
	g := c.cg.Group(st.Cgroup)
	c.mu.Lock()
	// Only a sandbox this driver started or recovered is cached: its record
	// goes with Destroy, so nothing stale outlives it.
	if s := c.sandboxes[id]; s != nil {
		s.group, s.dir = g, st.Dir
	}
	c.mu.Unlock()
	return g, st.Dir, nil
}

// OOMKills returns how many processes of the sandbox the kernel OOM killer
// has killed: one cgroup file read, cheap enough for the start and end of
// every exec (Stats reads a dozen files and the disk counters).
func (c *Core) OOMKills(ctx context.Context, id string) (uint64, error) {
	if err := checkID(id); err != nil {
		return 0, err
	}
	g, _, err := c.paths(id)
	if err != nil {
		return 0, fmt.Errorf("sandbox %s oom kills: %w", id, err)
	}
	n, err := g.OOMKills()
	if err != nil {
		return 0, fmt.Errorf("sandbox %s oom kills: %w", id, err)
	}
	return n, nil
}

// Stats samples the sandbox's cgroup counters and disk use.
func (c *Core) Stats(ctx context.Context, id string) (driver.Stats, error) {
	if err := checkID(id); err != nil {
		return driver.Stats{}, err
	}
	g, dir, err := c.paths(id)
	if err != nil {
		return driver.Stats{}, fmt.Errorf("sandbox %s stats: %w", id, err)
	}
	var s driver.Stats
	if g.Exists() {
		cpu, err := g.CPUUsage()
		if err != nil {
			return s, fmt.Errorf("sandbox %s stats: %w", id, err)
		}
		s.CPUSeconds = cpu.Seconds()
		if s.MemoryBytes, s.MemoryPeakBytes, err = g.Memory(); err != nil {
			return s, fmt.Errorf("sandbox %s stats: %w", id, err)
		}
		if s.PIDs, err = g.PIDs(); err != nil {
			return s, fmt.Errorf("sandbox %s stats: %w", id, err)
		}
		if s.OOMKills, err = g.OOMKills(); err != nil {
			return s, fmt.Errorf("sandbox %s stats: %w", id, err)
		}
	}
	if s.DiskBytes, s.DiskWrittenBytes, err = storage.Usage(dir); err != nil {
		return s, fmt.Errorf("sandbox %s disk usage: %w", id, err)
	}
	return s, nil
}
