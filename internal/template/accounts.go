package template

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// LookupLayers finds rel (slash-separated, relative to /) in the merged view
// of layer directories roots (lowest first), the way overlayfs would: the
// topmost layer that has it wins, a whiteout deletes it, an opaque
// directory hides what the layers below hold under it. It returns the host
// path of the winning entry. Symlinks are not followed.
func LookupLayers(roots []string, rel string) (string, bool) {
	rel = strings.Trim(filepath.ToSlash(filepath.Clean("/"+rel)), "/")
	if rel == "" {
		if len(roots) == 0 {
			return "", false
		}
		return roots[len(roots)-1], true
	}
	comps := strings.Split(rel, "/")
	for i := len(roots) - 1; i >= 0; i-- {
		p := roots[i]
		hidden := false
		for j, c := range comps {
			p = filepath.Join(p, c)
			var st unix.Stat_t
			if err := unix.Lstat(p, &st); err != nil {
				break
			}
			if isWhiteout(&st) {
				return "", false
			}
			if j == len(comps)-1 {
				return p, true
			}
			if st.Mode&unix.S_IFMT != unix.S_IFDIR {
				return "", false // a file in this layer hides the whole path
			}
			if v, err := getXattr(p, opaqueXattr); err == nil && string(v) == "y" {
				hidden = true
			}
		}
		if hidden {
			return "", false
		}
	}
	return "", false
}

func isWhiteout(st *unix.Stat_t) bool {
	return st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0
}

// Account is the user every sandbox's commands run as by default.
const (
	accountName = "user"
	accountID   = 1000
)

// AccountsLayer makes sure the merged view of layers (host directories,
// lowest first) has what the agent and the API's defaults need: an
// /etc/passwd with root and the default user "user" (uid 1000, home
// /home/user), the matching /etc/group entries, /home/user and /tmp. An
// image made for docker usually lacks the user. When something is
// missing, it returns the key and a writer function for a layer that adds
// it (the caller commits the layer); with nothing missing, ok is false.
//
// The key depends only on what the layer writes, so equal images share it.
func AccountsLayer(layers []string) (key string, write func(root string) error, ok bool, err error) {
	type file struct {
		rel  string
		data []byte
	}
	var files []file
	var dirs []dirSpec

	passwd, err := readMerged(layers, "etc/passwd")
	if err != nil {
		return "", nil, false, err
	}
	group, err := readMerged(layers, "etc/group")
	if err != nil {
		return "", nil, false, err
	}
	home := "/home/" + accountName
	np, changedP0 := addDBEntry(passwd, "root:x:0:0:root:/root:/bin/sh")
	np, changedP := addDBEntry(np, fmt.Sprintf("%s:x:%d:%d::%s:/bin/sh", accountName, accountID, accountID, home))
	ng, changedG0 := addDBEntry(group, "root:x:0:")
	ng, changedG := addDBEntry(ng, fmt.Sprintf("%s:x:%d:", accountName, accountID))
	if changedP0 || changedP {
		files = append(files, file{"etc/passwd", np})
	}
	if changedG0 || changedG {
		files = append(files, file{"etc/group", ng})
	}
	if _, ok := LookupLayers(layers, "home/"+accountName); !ok {
		dirs = append(dirs, dirSpec{"home/" + accountName, 0o755, accountID})
	}
	if _, ok := LookupLayers(layers, "tmp"); !ok {
		dirs = append(dirs, dirSpec{"tmp", 0o1777, 0})
	}
	if len(files) == 0 && len(dirs) == 0 {
		return "", nil, false, nil
	}
	h := sha256.New()
	fmt.Fprintf(h, "accounts v1\n")
	for _, f := range files {
		fmt.Fprintf(h, "file %s %d\n", f.rel, len(f.data))
		h.Write(f.data)
	}
	for _, d := range dirs {
		fmt.Fprintf(h, "dir %s %o %d\n", d.rel, d.mode, d.uid)
	}
	// Parent directories are copied from the merged view: their attributes
	// are part of what the layer writes.
	for _, rel := range []string{"etc", "home"} {
		if p, ok := LookupLayers(layers, rel); ok {
			var st unix.Stat_t
			if unix.Lstat(p, &st) == nil {
				fmt.Fprintf(h, "parent %s %o %d %d\n", rel, st.Mode, st.Uid, st.Gid)
			}
		}
	}
	key = hex.EncodeToString(h.Sum(nil))
	write = func(root string) error {
		for _, f := range files {
			if err := mkParents(layers, root, filepath.Dir(f.rel)); err != nil {
				return err
			}
			p := filepath.Join(root, f.rel)
			if err := os.WriteFile(p, f.data, 0o644); err != nil {
				return err
			}
			if err := os.Chmod(p, 0o644); err != nil {
				return err
			}
		}
		for _, d := range dirs {
			if err := mkParents(layers, root, filepath.Dir(d.rel)); err != nil {
				return err
			}
			p := filepath.Join(root, d.rel)
			if err := os.Mkdir(p, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
				return err
			}
			if err := os.Chown(p, d.uid, d.uid); err != nil {
				return err
			}
			if err := unix.Chmod(p, d.mode); err != nil {
				return err
			}
		}
		return nil
	}
	return key, write, true, nil
}

type dirSpec struct {
	rel  string
	mode uint32
	uid  int
}

// readMerged reads rel from the merged view; a missing file is empty.
func readMerged(layers []string, rel string) ([]byte, error) {
	p, ok := LookupLayers(layers, rel)
	if !ok {
		return nil, nil
	}
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		return nil, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, nil // a symlinked passwd is the image's business
	}
	return os.ReadFile(p)
}

// addDBEntry appends line to a colon database unless its name is there.
func addDBEntry(db []byte, line string) ([]byte, bool) {
	name, _, _ := strings.Cut(line, ":")
	for _, l := range strings.Split(string(db), "\n") {
		if n, _, _ := strings.Cut(l, ":"); n == name {
			return db, false
		}
	}
	out := append([]byte(nil), db...)
	if len(out) > 0 && !bytes.HasSuffix(out, []byte("\n")) {
		out = append(out, '\n')
	}
	return append(out, line+"\n"...), true
}

// mkParents creates rel's directories in root with the owner and mode they
// have in the merged view of layers (0755 root where they are missing): a
// directory in an upper layer replaces the attributes of the one below.
func mkParents(layers []string, root, rel string) error {
	if rel == "." || rel == "" {
		return nil
	}
	cur := ""
	for _, c := range strings.Split(filepath.ToSlash(rel), "/") {
		cur = filepath.Join(cur, c)
		p := filepath.Join(root, cur)
		if _, err := os.Lstat(p); err == nil {
			continue
		}
		mode, uid, gid := uint32(0o755), 0, 0
		if src, ok := LookupLayers(layers, cur); ok {
			var st unix.Stat_t
			if err := unix.Lstat(src, &st); err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
				mode, uid, gid = st.Mode&0o7777, int(st.Uid), int(st.Gid)
			}
		}
		if err := os.Mkdir(p, 0o700); err != nil {
			return err
		}
		if err := os.Chown(p, uid, gid); err != nil {
			return err
		}
		if err := unix.Chmod(p, mode); err != nil {
			return err
		}
	}
	return nil
}
