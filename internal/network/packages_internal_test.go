package network

import (
	"testing"

	"github.com/airlockhq/airlock/internal/pkgcache"
)

func TestDownloadCapOf(t *testing.T) {
	const mib = 1 << 20
	tests := []struct {
		name        string
		server, own int64 // bytes, MiB
		want        int64
	}{
		{"ServerOnly", 100 * mib, 0, 100 * mib},
		{"OwnLowers", 100 * mib, 10, 10 * mib},
		{"OwnCannotRaise", 100 * mib, 500, 100 * mib},
		{"OwnWithoutServerCap", 0, 7, 7 * mib},
		{"NoCap", 0, 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := &Manager{cfg: Config{MaxDownloadBytes: tc.server}}
			if got := m.downloadCap(Policy{MaxDownloadMB: tc.own}); got != tc.want {
				t.Fatalf("got %d, want %d", got, tc.want)
			}
		})
	}
	if _, err := ParsePolicy(Policy{Mode: ModeNone, MaxDownloadMB: -1}); err == nil {
		t.Fatal("negative cap accepted")
	}
	if p, err := ParsePolicy(Policy{Mode: ModeNone, MaxDownloadMB: 5}); err != nil || p.MaxDownloadMB != 5 {
		t.Fatalf("cap lost in normalization: %+v %v", p, err)
	}
}

func TestPackageEnv(t *testing.T) {
	m := &Manager{mirror: pkgcache.NewMirror(pkgcache.Config{Upstreams: map[string]string{
		pkgcache.RegPyPI: "https://pypi.example", pkgcache.RegNPM: "https://npm.example", pkgcache.RegGoProxy: "https://go.example",
	}})}
	tests := []struct {
		name string
		p    Policy
		want map[string]string
	}{
		{"PyPI", Policy{Mode: ModeAllowlist, Registries: []string{"pypi"}}, map[string]string{
			"PIP_INDEX_URL": "http://" + PackageHost + "/pypi/simple/", "PIP_TRUSTED_HOST": PackageHost,
			"UV_DEFAULT_INDEX": "http://" + PackageHost + "/pypi/simple/", "UV_INSECURE_HOST": PackageHost}},
		{"NPMAndGo", Policy{Mode: ModeAllowlist, Registries: []string{"goproxy", "npm"}}, map[string]string{
			"NPM_CONFIG_REGISTRY": "http://" + PackageHost + "/npm/", "GOPROXY": "http://" + PackageHost + "/goproxy"}},
		{"DebianNeedsNone", Policy{Mode: ModeAllowlist, Registries: []string{"debian"}}, nil},
		{"Offline", Policy{Mode: ModeAllowlist, Offline: true}, nil},
		{"Open", Policy{Mode: ModeOpen}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := m.PackageEnv(tc.p)
			if len(got) != len(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Fatalf("%s = %q, want %q", k, got[k], v)
				}
			}
		})
	}
	if env := (&Manager{}).PackageEnv(Policy{Mode: ModeAllowlist, Registries: []string{"pypi"}}); env != nil {
		t.Fatalf("env without a mirror: %v", env)
	}
}
