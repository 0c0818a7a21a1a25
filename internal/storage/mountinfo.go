package storage

import (
	"sort"
	"strings"

	"github.com/airlockhq/airlock/internal/mountinfo"
)

// under reports whether path is root or inside it.
func under(path, root string) bool { return mountinfo.Under(path, root) }

// mountsUnder returns the mounts of all (in mountinfo's order) at or under
// any of roots in an order that can be unmounted: deepest first, and newest
// first on a shared mount point.
func mountsUnder(all []mountinfo.Mount, roots []string) []mountinfo.Mount {
	type entry struct {
		m     mountinfo.Mount
		order int // later lines are newer mounts on a shared target
	}
	var sel []entry
	for i, m := range all {
		for _, r := range roots {
			if under(m.Target, r) {
				sel = append(sel, entry{m, i})
				break
			}
		}
	}
	sort.SliceStable(sel, func(i, j int) bool {
		di, dj := strings.Count(sel[i].m.Target, "/"), strings.Count(sel[j].m.Target, "/")
		if di != dj {
			return di > dj
		}
		return sel[i].order > sel[j].order
	})
	out := make([]mountinfo.Mount, len(sel))
	for i, e := range sel {
		out[i] = e.m
	}
	return out
}
