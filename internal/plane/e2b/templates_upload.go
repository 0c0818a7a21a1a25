package e2b

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// The files of a COPY step: the SDK asks GET /templates/{id}/files/{hash}
// whether they are here; if not it PUTs a tar (gzipped by default) of
// them, their paths relative to its context directory, to the URL given:
// this daemon, with a one-use token that stands for the API key.

const (
	// uploadSlotTTL is how long an upload URL stays valid.
	uploadSlotTTL = 30 * time.Minute
	// maxUploadEntries bounds the entries of an upload (the builder takes
	// 200 000 in a whole context).
	maxUploadEntries = 200_000
	// maxTenantUploadFactor bounds the uploads a tenant holds at once:
	// this many times the upload limit.
	maxTenantUploadFactor = 4
)

// fileUpload is E2B's TemplateBuildFileUpload.
type fileUpload struct {
	Present bool   `json:"present"`
	URL     string `json:"url,omitempty"`
}

func (t *templateAPI) fileUploadLink(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	if _, err := t.service(); err != nil {
		return err
	}
	templateID, hash := r.PathValue("templateID"), r.PathValue("hash")
	if !e2bNameRE.MatchString(templateID) {
		return errf(errdefs.ErrInvalidArgument, "template id %q must match %s", templateID, e2bNameRE)
	}
	if !filesHashRE.MatchString(hash) {
		return errf(errdefs.ErrInvalidArgument, "files hash must match %s", filesHashRE)
	}
	now := time.Now()
	t.mu.Lock()
	t.sweepLocked(now)
	if u, ok := t.uploads[uploadKey{p.Tenant, hash}]; ok {
		u.used = now
		t.mu.Unlock()
		writeJSON(w, http.StatusCreated, fileUpload{Present: true})
		return nil
	}
	if t.tenantUploadsLocked(p.Tenant) >= maxUploadsPerTenant {
		t.mu.Unlock()
		return errf(errdefs.ErrRateLimited, "too many template file uploads held (at most %d; they are dropped an hour after their last use)", maxUploadsPerTenant)
	}
	b := make([]byte, 24)
	rand.Read(b)
	tok := hex.EncodeToString(b)
	t.slots[tok] = &uploadSlot{tenant: p.Tenant, templateID: templateID, hash: hash, expires: now.Add(uploadSlotTTL)}
	t.mu.Unlock()
	scheme := "http"
	if r.TLS != nil || r.Header.Get("X-Forwarded-Proto") == "https" {
		scheme = "https"
	}
	u := url.URL{Scheme: scheme, Host: r.Host, Path: "/templates/" + templateID + "/files/" + hash,
		RawQuery: url.Values{"token": {tok}}.Encode()}
	writeJSON(w, http.StatusCreated, fileUpload{URL: u.String()})
	return nil
}

func (t *templateAPI) tenantUploadsLocked(tenant string) int {
	n := 0
	for k := range t.uploads {
		if k.tenant == tenant {
			n++
		}
	}
	for _, s := range t.slots {
		if s.tenant == tenant {
			n++
		}
	}
	return n
}

// receiveUpload takes the PUT of an upload URL.
func (t *templateAPI) receiveUpload(w http.ResponseWriter, r *http.Request) {
	templateID, hash, tok := r.PathValue("templateID"), r.PathValue("hash"), r.URL.Query().Get("token")
	t.mu.Lock()
	s, ok := t.slots[tok]
	if ok && (s.templateID != templateID || s.hash != hash || time.Now().After(s.expires)) {
		ok = false
	}
	if ok {
		delete(t.slots, tok) // one use
	}
	t.mu.Unlock()
	if !ok {
		err := errf(errdefs.ErrUnauthenticated, "invalid or expired upload url")
		t.h.authFailed(r, err, "control plane")
		t.h.writeError(w, r, err)
		return
	}
	if err := t.storeUpload(r, s); err != nil {
		t.h.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (t *templateAPI) storeUpload(r *http.Request, s *uploadSlot) error {
	svc, err := t.service()
	if err != nil {
		return err
	}
	max := t.h.cfg.MaxUploadBytes
	if r.ContentLength > max {
		return errf(errdefs.ErrTooLarge, "the upload exceeds %d bytes", max)
	}
	f, err := svc.TemplateUpload()
	if err != nil {
		return err
	}
	keep := false
	defer func() {
		f.Close()
		if !keep {
			os.Remove(f.Name())
		}
	}()
	n, err := io.Copy(f, io.LimitReader(r.Body, max+1))
	if err != nil {
		return errf(errdefs.ErrInvalidArgument, "reading the upload: %v", err)
	}
	if n > max {
		return errf(errdefs.ErrTooLarge, "the upload exceeds %d bytes", max)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	if err := checkUpload(f, max); err != nil {
		return err
	}
	k := uploadKey{s.tenant, s.hash}
	t.mu.Lock()
	defer t.mu.Unlock()
	var held int64
	for ok, u := range t.uploads {
		if ok.tenant == s.tenant && ok != k {
			held += u.size
		}
	}
	if held+n > maxTenantUploadFactor*max {
		return errf(errdefs.ErrQuotaExceeded, "this tenant's template uploads would exceed %d bytes (they are dropped an hour after their last use)", maxTenantUploadFactor*max)
	}
	if old, ok := t.uploads[k]; ok {
		os.Remove(old.path)
	}
	keep = true
	t.uploads[k] = &e2bUpload{path: f.Name(), size: n, used: time.Now()}
	return nil
}

// uploadReader reads an upload: a tar, gzipped or not.
func uploadReader(f io.Reader) (io.Reader, func(), error) {
	br := bufio.NewReader(f)
	magic, _ := br.Peek(2)
	if len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, nil, errf(errdefs.ErrInvalidArgument, "the upload is not a valid gzip stream")
		}
		return zr, func() { zr.Close() }, nil
	}
	return br, func() {}, nil
}

// uploadName cleans an entry name of an upload; an entry that climbs out
// of the archive's root (or names it) is refused.
func uploadName(name string) (string, error) {
	if strings.IndexByte(name, 0) >= 0 {
		return "", errf(errdefs.ErrInvalidArgument, "an upload entry name contains a NUL byte")
	}
	rel := path.Clean(strings.TrimLeft(name, "/"))
	if rel == ".." || strings.HasPrefix(rel, "../") {
		return "", errf(errdefs.ErrInvalidArgument, "upload entry %q escapes the archive's root", name)
	}
	return rel, nil
}

// checkUpload reads the whole archive: a tar of files, directories and
// links, names inside its root, at most max bytes unpacked.
func checkUpload(f io.Reader, max int64) error {
	r, closeFn, err := uploadReader(f)
	if err != nil {
		return err
	}
	defer closeFn()
	tr := tar.NewReader(r)
	var total int64
	for n := 0; ; n++ {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return errf(errdefs.ErrInvalidArgument, "the upload is not a valid tar archive")
		}
		if n >= maxUploadEntries {
			return errf(errdefs.ErrTooLarge, "the upload has more than %d entries", maxUploadEntries)
		}
		if _, err := uploadName(hdr.Name); err != nil {
			return err
		}
		switch hdr.Typeflag {
		case tar.TypeReg, tar.TypeDir, tar.TypeSymlink:
		case tar.TypeLink:
			if _, err := uploadName(hdr.Linkname); err != nil {
				return err
			}
		default:
			return errf(errdefs.ErrInvalidArgument, "upload entry %q is not a file, directory or link", hdr.Name)
		}
		total += hdr.Size
		if total > max {
			return errf(errdefs.ErrTooLarge, "the upload exceeds %d bytes unpacked", max)
		}
		if _, err := io.Copy(io.Discard, tr); err != nil {
			return errf(errdefs.ErrInvalidArgument, "the upload is truncated")
		}
	}
}

// writeContext makes the build context: every upload of hashes under a
// directory named by its hash. The builder checks the result again
// (entry names, links, limits) before any step reads it.
func (t *templateAPI) writeContext(svc Templates, hashes []string, files map[string]string) (string, error) {
	out, err := svc.TemplateUpload()
	if err != nil {
		return "", err
	}
	ok := false
	defer func() {
		if !ok {
			out.Close()
			os.Remove(out.Name())
		}
	}()
	tw := tar.NewWriter(out)
	max := t.h.cfg.MaxUploadBytes
	var total int64
	for _, h := range hashes {
		if err := tw.WriteHeader(&tar.Header{Name: h + "/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: time.Now()}); err != nil {
			return "", err
		}
		n, err := appendUpload(tw, files[h], h, max-total)
		if err != nil {
			return "", err
		}
		total += n
	}
	if err := tw.Close(); err != nil {
		return "", err
	}
	if err := out.Close(); err != nil {
		return "", err
	}
	ok = true
	return out.Name(), nil
}

// appendUpload copies the entries of upload into tw under prefix.
func appendUpload(tw *tar.Writer, upload, prefix string, budget int64) (int64, error) {
	f, err := os.Open(upload)
	if err != nil {
		return 0, fmt.Errorf("opening an upload: %w", err)
	}
	defer f.Close()
	r, closeFn, err := uploadReader(f)
	if err != nil {
		return 0, err
	}
	defer closeFn()
	tr := tar.NewReader(r)
	var total int64
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return total, nil
		}
		if err != nil {
			return 0, errf(errdefs.ErrInvalidArgument, "an upload is not a valid tar archive")
		}
		name, err := uploadName(hdr.Name)
		if err != nil {
			return 0, err
		}
		out := &tar.Header{Typeflag: hdr.Typeflag, Name: prefix + "/" + name, Mode: hdr.Mode & 0o7777, ModTime: hdr.ModTime}
		switch hdr.Typeflag {
		case tar.TypeReg:
			out.Size = hdr.Size
		case tar.TypeDir:
			if name == "." {
				continue
			}
			out.Name += "/"
		case tar.TypeSymlink:
			out.Linkname = hdr.Linkname
		case tar.TypeLink:
			target, err := uploadName(hdr.Linkname)
			if err != nil {
				return 0, err
			}
			out.Linkname = prefix + "/" + target
		default:
			continue
		}
		if total += out.Size; total > budget {
			return 0, errf(errdefs.ErrTooLarge, "the files of the build exceed %d bytes", budget)
		}
		if err := tw.WriteHeader(out); err != nil {
			return 0, err
		}
		if out.Size > 0 {
			if _, err := io.CopyN(tw, tr, out.Size); err != nil {
				return 0, errf(errdefs.ErrInvalidArgument, "an upload is truncated")
			}
		}
	}
}
