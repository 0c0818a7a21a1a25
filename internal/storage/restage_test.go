package storage

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/mountinfo"
)

// mountsUnder lists the mount points at or below dir, sorted.
func mountPointsUnder(t *testing.T, dir string) []string {
	t.Helper()
	ms, err := mountinfo.Read()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range ms {
		if m.Target == dir || strings.HasPrefix(m.Target, dir+"/") {
			out = append(out, strings.TrimPrefix(m.Target, dir+"/"))
		}
	}
	slices.Sort(out)
	return out
}

// TestRestage: a staged root is the layers with nothing of what the
// sandbox wrote; Abort leaves the current root as it was and nothing new;
// Commit puts the new root at rootfs/ with Setup's names (rw/upper, the
// old upper's bytes gone), a second layer set replaces the first, and
// TeardownDir removes it all. On both writable layer kinds.
func TestRestage(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			f := newFixture(t)
			dir := f.dir(t, "sbx")
			teardownOnFail(t, dir)
			ctx := context.Background()
			rootfs, err := Setup(ctx, f.opts(dir, m.tmpfs))
			if err != nil {
				t.Fatal(err)
			}
			written := filepath.Join(rootfs.Path(), "home/user/written")
			if err := os.WriteFile(written, make([]byte, 1<<20), 0o644); err != nil {
				t.Fatal(err)
			}
			setUp := mountPointsUnder(t, dir)

			st, err := Restage(ctx, Options{Dir: dir, Layers: []string{f.layer}, UIDBase: testBase, IDCount: testCount})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(filepath.Join(st.Path(), "home/user/written")); !os.IsNotExist(err) {
				t.Fatalf("the staged root has what the sandbox wrote: %v", err)
			}
			if b, err := os.ReadFile(filepath.Join(st.Path(), "home/user/notes")); err != nil || string(b) != "hello" {
				t.Fatalf("the staged root's layer file: %q %v", b, err)
			}
			st.Abort(ctx)
			if got := mountPointsUnder(t, dir); !slices.Equal(got, setUp) {
				t.Fatalf("mounts after Abort %v, want %v", got, setUp)
			}
			if _, err := os.Stat(written); err != nil {
				t.Fatalf("Abort touched the current root: %v", err)
			}

			for gen := range 2 {
				st, err := Restage(ctx, Options{Dir: dir, Layers: []string{f.layer}, UIDBase: testBase, IDCount: testCount})
				if err != nil {
					t.Fatal(err)
				}
				if err := st.Commit(ctx); err != nil {
					t.Fatal(err)
				}
				if _, err := os.Stat(written); !os.IsNotExist(err) {
					t.Fatalf("commit %d: rootfs still has what the sandbox wrote: %v", gen, err)
				}
				if b, err := os.ReadFile(filepath.Join(rootfs.Path(), "home/user/notes")); err != nil || string(b) != "hello" {
					t.Fatalf("commit %d: rootfs's layer file: %q %v", gen, b, err)
				}
				upper, err := UpperDir(dir)
				if err != nil {
					t.Fatal(err)
				}
				if ents, err := os.ReadDir(upper); err != nil || len(ents) != 0 {
					t.Fatalf("commit %d: upper %v %v, want empty", gen, ents, err)
				}
				rw := filepath.Dir(upper)
				ents, _ := os.ReadDir(rw)
				var names []string
				for _, e := range ents {
					names = append(names, e.Name())
				}
				if slices.ContainsFunc(names, func(n string) bool { return strings.HasSuffix(n, oldSuffix) || strings.HasSuffix(n, newSuffix) }) {
					t.Fatalf("commit %d: rw holds %v", gen, names)
				}
				got := mountPointsUnder(t, dir)
				if len(got) != len(setUp) || !slices.Contains(got, "rootfs") || slices.Contains(got, "storage/lower/0") {
					t.Fatalf("commit %d: mounts %v (after setup %v)", gen, got, setUp)
				}
				// The new root takes writes as the old one did.
				if err := os.WriteFile(written, []byte("again"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			stEnts, _ := os.ReadDir(filepath.Join(dir, storageName))
			var lowers []string
			for _, e := range stEnts {
				if strings.HasPrefix(e.Name(), lowerName) {
					lowers = append(lowers, e.Name())
				}
			}
			if len(lowers) != 1 || lowers[0] == lowerName {
				t.Fatalf("lower sets left: %v, want the last one only", lowers)
			}
			if err := TeardownDir(ctx, dir); err != nil {
				t.Fatal(err)
			}
			if got := mountPointsUnder(t, dir); len(got) != 0 {
				t.Fatalf("mounts after teardown: %v", got)
			}
		})
	}
}
