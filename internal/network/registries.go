package network

import (
	"net/url"
	"os"
	"strings"
)

// RegistryEnvPrefix, followed by a registry set's name in upper case, names
// an environment variable that replaces the set's hosts with a
// comma-separated list: AIRLOCK_REGISTRY_PYPI="pypi.org,files.pythonhosted.org".
const RegistryEnvPrefix = "AIRLOCK_REGISTRY_"

// DefaultRegistries returns the registry sets' host names: built-in ones
// where they are fixed (pypi), the Go proxy and npm registry the daemon's
// environment configures ($GOPROXY, $NPM_CONFIG_REGISTRY), each replaced by
// its AIRLOCK_REGISTRY_<NAME> variable, then by over. Debian's mirror is the
// host's (the daemon passes the host of template.Mirror() as "debian"), so
// that no mirror is ever written into airlock. A set left without hosts
// cannot be allowed: Setup and Update then fail with a clear error.
func DefaultRegistries(over map[string][]string) map[string][]string {
	out := map[string][]string{
		"pypi": {"pypi.org", "files.pythonhosted.org"},
	}
	if hosts := urlHosts(os.Getenv("GOPROXY")); len(hosts) > 0 {
		out["goproxy"] = hosts
	}
	for _, v := range []string{"NPM_CONFIG_REGISTRY", "npm_config_registry"} {
		if hosts := urlHosts(os.Getenv(v)); len(hosts) > 0 {
			out["npm"] = hosts
			break
		}
	}
	for _, name := range KnownRegistries {
		if v := os.Getenv(RegistryEnvPrefix + strings.ToUpper(name)); v != "" {
			out[name] = splitHosts(v)
		}
	}
	for name, hosts := range over {
		out[name] = hosts
	}
	return out
}

// urlHosts returns the host names of a comma or pipe separated URL list
// (GOPROXY's syntax), skipping keywords like "direct" and "off".
func urlHosts(list string) []string {
	var out []string
	for _, f := range strings.FieldsFunc(list, func(r rune) bool { return r == ',' || r == '|' }) {
		u, err := url.Parse(strings.TrimSpace(f))
		if err != nil || u.Hostname() == "" {
			continue
		}
		out = append(out, strings.ToLower(u.Hostname()))
	}
	return out
}

func splitHosts(v string) []string {
	var out []string
	for _, h := range strings.Split(v, ",") {
		if h = strings.ToLower(strings.TrimSpace(h)); h != "" {
			out = append(out, h)
		}
	}
	return out
}
