package agent_test

import (
	"errors"
	"maps"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// TestFileMetadata: an upload's metadata are the file's user.e2b.*
// extended attributes: shown by stat and list, kept by a rename, replaced
// by the next upload (none clears them), set by code in the sandbox too,
// and bounded both ways.
func TestFileMetadata(t *testing.T) {
	e := newFileEnv(t)
	ctx := ctxT(t)
	probe := e.host("home/user/.xattr-probe")
	writeFile(t, probe, "")
	if err := unix.Setxattr(probe, "user.e2b.probe", []byte("x"), 0); errors.Is(err, unix.ENOTSUP) {
		t.Skipf("the test's file system keeps no user xattrs: %v", err)
	}
	md := map[string]string{"author": "mish", "purpose": "upload"}
	if _, err := e.c.WriteFileWithMetadata(ctx, "/home/user/m.txt", "", 0, md, strings.NewReader("data"), 0); err != nil {
		t.Fatal(err)
	}
	fi, err := e.c.Stat(ctx, "/home/user/m.txt", "")
	if err != nil || !maps.Equal(fi.Metadata, md) {
		t.Fatalf("stat metadata %v (%v), want %v", fi.Metadata, err, md)
	}
	ls, err := e.c.List(ctx, "/home/user", "", 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range ls {
		if f.Name == "m.txt" && !maps.Equal(f.Metadata, md) {
			t.Fatalf("list metadata %v, want %v", f.Metadata, md)
		}
	}
	if err := e.c.Move(ctx, "/home/user/m.txt", "/home/user/n.txt", ""); err != nil {
		t.Fatal(err)
	}
	if fi, _ := e.c.Stat(ctx, "/home/user/n.txt", ""); !maps.Equal(fi.Metadata, md) {
		t.Fatalf("metadata after rename %v, want %v", fi.Metadata, md)
	}
	if _, err := e.c.WriteFile(ctx, "/home/user/n.txt", "", 0, strings.NewReader("again"), 0); err != nil {
		t.Fatal(err)
	}
	if fi, _ := e.c.Stat(ctx, "/home/user/n.txt", ""); fi.Metadata != nil {
		t.Fatalf("metadata after an overwrite without any: %v, want none", fi.Metadata)
	}
	// Set from inside the sandbox; other namespaces and oversized or
	// non-UTF-8 values are not shown.
	p := e.host("home/user/n.txt")
	for name, v := range map[string]string{"user.e2b.author": "mish", "user.other": "x", "user.e2b.bin": "\xff\xfe"} {
		if err := unix.Setxattr(p, name, []byte(v), 0); err != nil {
			t.Fatal(err)
		}
	}
	// Over 4 KiB, where the file system can hold it (ext4 cannot).
	if err := unix.Setxattr(p, "user.e2b.big", []byte(strings.Repeat("b", 5000)), 0); err != nil && !errors.Is(err, unix.ENOSPC) && !errors.Is(err, unix.E2BIG) {
		t.Fatal(err)
	}
	if fi, _ := e.c.Stat(ctx, "/home/user/n.txt", ""); !maps.Equal(fi.Metadata, map[string]string{"author": "mish"}) {
		t.Fatalf("metadata set in the sandbox: %v, want author only", fi.Metadata)
	}
	many := map[string]string{}
	for i := range agentproto.MaxMetadataKeys + 1 {
		many["k"+strconv.Itoa(i)] = "v"
	}
	for name, bad := range map[string]map[string]string{
		"too many keys": many,
		"empty key":     {"": "v"},
		"NUL in a key":  {"a\x00b": "v"},
		"too large":     {"k": strings.Repeat("v", agentproto.MaxMetadataBytes)},
	} {
		_, err := e.c.WriteFileWithMetadata(ctx, "/home/user/bad.txt", "", 0, bad, strings.NewReader("x"), 0)
		if !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: %v, want invalid_argument", name, err)
		}
	}
	if _, err := e.c.Stat(ctx, "/home/user/bad.txt", ""); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a refused upload left its file: %v", err)
	}
}
