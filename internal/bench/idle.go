package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/client"
)

// IdleMemory is the host memory of idle sandboxes' processes (the agent
// and, with runtimes that keep one, the runtime's shim), per sandbox.
type IdleMemory struct {
	// Sandboxes is how many idle sandboxes were measured; Procs is how many
	// processes they had in all.
	Sandboxes, Procs int
	// RSSBytes and PSSBytes are per sandbox (means). RSS counts shared pages
	// (the agent binary's text) in full for every sandbox; PSS divides them
	// among the processes sharing them, so N×PSS is what N sandboxes cost.
	RSSBytes, PSSBytes int64
}

// procRoot is /proc; tests point it at a fixture.
var procRoot = "/proc"

// idleOverhead creates n sandboxes, lets them settle, measures their
// processes on this host and deletes them (also on failure).
func idleOverhead(ctx context.Context, c *client.Client, creq api.CreateSandboxRequest, n int, settle time.Duration) (mem *IdleMemory, err error) {
	ids := make([]string, 0, n)
	defer func() {
		for _, id := range ids {
			if derr := deleteSandbox(ctx, c, id); derr != nil && err == nil {
				err = derr
			}
		}
	}()
	for range n {
		sbx, err := c.CreateSandbox(ctx, creq)
		if err != nil {
			return nil, fmt.Errorf("creating sandbox: %w", err)
		}
		ids = append(ids, sbx.ID)
	}
	// Let start-up work (the agent's first allocations, runc's exit) pass.
	select {
	case <-time.After(settle):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	pids, err := sandboxPids(ids)
	if err != nil {
		return nil, err
	}
	mem = &IdleMemory{Sandboxes: n}
	for _, id := range ids {
		if len(pids[id]) == 0 {
			return nil, fmt.Errorf("no process of sandbox %s on this host (is the server on another host, or not root?)", id)
		}
		for _, pid := range pids[id] {
			rss, pss, err := processMemory(pid)
			if errors.Is(err, os.ErrNotExist) {
				continue // ended meanwhile
			}
			if err != nil {
				return nil, err
			}
			mem.Procs++
			mem.RSSBytes += rss
			mem.PSSBytes += pss
		}
	}
	mem.RSSBytes /= int64(n)
	mem.PSSBytes /= int64(n)
	return mem, nil
}

// sandboxPids finds the host processes of each sandbox by its cgroup: every
// driver puts a sandbox's processes in a cgroup named after its id (runc:
// /airlock/<id>), in every hierarchy, whatever the runtime's process layout.
func sandboxPids(ids []string) (map[string][]int, error) {
	ents, err := os.ReadDir(procRoot)
	if err != nil {
		return nil, err
	}
	out := map[string][]int{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(procRoot, e.Name(), "cgroup"))
		if err != nil {
			continue // ended, or not ours to read
		}
		for _, id := range ids {
			if inCgroupOf(string(b), id) {
				out[id] = append(out[id], pid)
				break
			}
		}
	}
	return out, nil
}

// inCgroupOf reports whether a /proc/PID/cgroup listing puts the process in
// a cgroup named id (or below one).
func inCgroupOf(listing, id string) bool {
	for line := range strings.Lines(listing) {
		// hierarchy-ID:controllers:path
		parts := strings.SplitN(strings.TrimSpace(line), ":", 3)
		if len(parts) != 3 {
			continue
		}
		p := parts[2]
		if strings.HasSuffix(p, "/"+id) || strings.Contains(p, "/"+id+"/") {
			return true
		}
	}
	return false
}

// processMemory returns a process's resident and proportional set sizes
// (/proc/PID/smaps_rollup).
func processMemory(pid int) (rss, pss int64, err error) {
	f, err := os.Open(filepath.Join(procRoot, strconv.Itoa(pid), "smaps_rollup"))
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	var haveRSS, havePSS bool
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || (k != "Rss" && k != "Pss") {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("smaps_rollup of %d: %q: %w", pid, sc.Text(), err)
		}
		if k == "Rss" {
			rss, haveRSS = kb<<10, true
		} else {
			pss, havePSS = kb<<10, true
		}
	}
	if err := sc.Err(); err != nil {
		return 0, 0, err
	}
	if !haveRSS || !havePSS {
		return 0, 0, fmt.Errorf("smaps_rollup of %d: no Rss or Pss", pid)
	}
	return rss, pss, nil
}
