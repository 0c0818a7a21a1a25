package storage

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestScratchMountOptions checks the writable layer's ext4 options: a
// scratch filesystem that neither forces writeback on rename-over nor
// flushes the host disk on fsync, and still no devices or setuid.
func TestScratchMountOptions(t *testing.T) {
	f := newFixture(t)
	dir := f.dir(t, "sbx")
	teardownOnFail(t, dir)
	if _, err := Setup(context.Background(), f.opts(dir, false)); err != nil {
		t.Fatal(err)
	}
	rw, err := filepath.EvalSymlinks(filepath.Join(dir, storageName, rwName))
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var mountOpts, superOpts string
	for _, line := range strings.Split(string(b), "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		f := strings.Fields(pre)
		if !ok || len(f) < 6 || f[4] != rw {
			continue
		}
		q := strings.Fields(post)
		if len(q) < 3 || q[0] != "ext4" {
			t.Fatalf("writable layer is %q, want ext4", post)
		}
		mountOpts, superOpts = f[5], q[2]
	}
	if superOpts == "" {
		t.Fatalf("no ext4 mount at %s", rw)
	}
	for _, want := range []string{"noauto_da_alloc", "nobarrier"} {
		if !strings.Contains(","+superOpts+",", ","+want+",") {
			t.Errorf("super options %q lack %s", superOpts, want)
		}
	}
	for _, want := range []string{"nodev", "nosuid"} {
		if !strings.Contains(","+mountOpts+",", ","+want+",") {
			t.Errorf("mount options %q lack %s", mountOpts, want)
		}
	}
}
