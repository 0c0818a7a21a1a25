package pkgcache

import (
	"net/url"
	"path"
	"strings"
)

// Package names what an artifact's URL path says it is; empty fields when
// the path does not tell.
type Package struct {
	Name    string `json:"name,omitempty"`
	Version string `json:"version,omitempty"`
}

// PackageOf parses the path of an artifact of registry set reg (the path
// below the registry's prefix on the mirror, or the upstream URL's path):
//
//	pypi:    …/requests-2.31.0-py3-none-any.whl, …/requests-2.31.0.tar.gz
//	npm:     /@scope/name/-/name-1.2.3.tgz, /left-pad/-/left-pad-1.3.0.tgz
//	goproxy: /github.com/!foo/bar/@v/v1.2.3.zip
//	debian:  /pool/main/c/curl/curl_7.88.1-10_amd64.deb
func PackageOf(reg, p string) Package {
	if u, err := url.PathUnescape(p); err == nil {
		p = u
	}
	base := path.Base(p)
	switch reg {
	case "pypi":
		return pypiName(base)
	case "npm":
		pkg, file, ok := strings.Cut(strings.TrimPrefix(p, "/"), "/-/")
		if !ok || !strings.HasSuffix(file, ".tgz") {
			return Package{}
		}
		short := pkg
		if i := strings.LastIndexByte(pkg, '/'); i >= 0 {
			short = pkg[i+1:]
		}
		v, ok := strings.CutPrefix(strings.TrimSuffix(file, ".tgz"), short+"-")
		if !ok {
			return Package{Name: pkg}
		}
		return Package{Name: pkg, Version: v}
	case "goproxy":
		mod, file, ok := strings.Cut(strings.TrimPrefix(p, "/"), "/@v/")
		if !ok {
			return Package{}
		}
		v := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(file, ".zip"), ".mod"), ".info")
		return Package{Name: unescapeModule(mod), Version: v}
	case "debian":
		if !strings.Contains(p, "/pool/") && !strings.HasPrefix(p, "pool/") {
			return Package{}
		}
		for _, ext := range []string{".deb", ".udeb", ".dsc"} {
			if stem, ok := strings.CutSuffix(base, ext); ok {
				parts := strings.Split(stem, "_")
				if len(parts) >= 2 {
					return Package{Name: parts[0], Version: parts[1]}
				}
			}
		}
		// Source tarballs: name_version.orig.tar.xz and the like.
		if name, rest, ok := strings.Cut(base, "_"); ok {
			v, _, _ := strings.Cut(rest, ".orig")
			v, _, _ = strings.Cut(v, ".debian")
			v = strings.TrimSuffix(strings.TrimSuffix(v, ".tar.xz"), ".tar.gz")
			return Package{Name: name, Version: v}
		}
	}
	return Package{}
}

// pypiName parses a wheel (name-version(-build)?-py-abi-plat.whl, name
// with underscores) or an sdist (name-version.tar.gz or .zip).
func pypiName(base string) Package {
	if stem, ok := strings.CutSuffix(base, ".whl"); ok {
		parts := strings.Split(stem, "-")
		if len(parts) < 5 {
			return Package{}
		}
		return Package{Name: normalizePyPI(parts[0]), Version: parts[1]}
	}
	for _, ext := range []string{".tar.gz", ".zip", ".tar.bz2", ".tgz"} {
		if stem, ok := strings.CutSuffix(base, ext); ok {
			// The version starts after the last "-" followed by a digit.
			for i := len(stem) - 1; i > 0; i-- {
				if stem[i-1] == '-' && stem[i] >= '0' && stem[i] <= '9' {
					return Package{Name: normalizePyPI(stem[:i-1]), Version: stem[i:]}
				}
			}
			return Package{}
		}
	}
	return Package{}
}

// normalizePyPI is PEP 503's name normalization.
func normalizePyPI(name string) string {
	name = strings.ToLower(name)
	return strings.NewReplacer("_", "-", ".", "-").Replace(name)
}

// unescapeModule undoes the Go module proxy's case encoding ("!a" is "A").
func unescapeModule(s string) string {
	var b strings.Builder
	bang := false
	for _, r := range s {
		switch {
		case bang && r >= 'a' && r <= 'z':
			b.WriteRune(r - 'a' + 'A')
			bang = false
		case r == '!':
			bang = true
		default:
			b.WriteRune(r)
			bang = false
		}
	}
	return b.String()
}

// immutable reports whether the artifact at p (below registry reg's
// prefix) never changes once published, so that it may be cached.
func immutable(reg, p string) bool {
	switch reg {
	case "pypi":
		return strings.HasPrefix(p, "/files/") && pypiName(path.Base(p)) != Package{}
	case "npm":
		return strings.Contains(p, "/-/") && strings.HasSuffix(p, ".tgz")
	case "goproxy":
		_, file, ok := strings.Cut(p, "/@v/")
		return ok && file != "list" && (strings.HasSuffix(file, ".zip") || strings.HasSuffix(file, ".mod") || strings.HasSuffix(file, ".info"))
	case "debian":
		// The pool (mirrors put it under a path of their own: /debian/pool/)
		// and by-hash index files never change; dists/ does.
		return strings.Contains(p, "/pool/") || strings.Contains(p, "/by-hash/")
	}
	return false
}
