package storage

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/mountinfo"
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
	all, err := mountinfo.Read()
	if err != nil {
		t.Fatal(err)
	}
	var mountOpts, superOpts string
	for _, m := range all {
		if m.Target != rw {
			continue
		}
		if m.FSType != "ext4" {
			t.Fatalf("writable layer is %s, want ext4", m.FSType)
		}
		mountOpts, superOpts = m.Options, m.SuperOptions
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
