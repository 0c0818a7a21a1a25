package network

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/internal/errdefs"
)

func TestParsePolicy(t *testing.T) {
	tests := []struct {
		name    string
		in      Policy
		want    Policy
		wantErr string
	}{
		{name: "default_mode", in: Policy{}, want: Policy{Mode: ModeNone}},
		{name: "normalizes", in: Policy{Mode: ModeAllowlist, Allow: []string{" PyPI.org. ", "*.Example.com", "pypi.org", "10.0.0.0/8:443", "1.2.3.4"}},
			want: Policy{Mode: ModeAllowlist, Allow: []string{"*.example.com", "1.2.3.4/32", "10.0.0.0/8:443", "pypi.org"}}},
		{name: "digit_name", in: Policy{Mode: ModeAllowlist, Allow: []string{"1password.com"}}, want: Policy{Mode: ModeAllowlist, Allow: []string{"1password.com"}}},
		{name: "open_cidr", in: Policy{Mode: ModeOpen, Allow: []string{"169.254.169.254"}}, want: Policy{Mode: ModeOpen, Allow: []string{"169.254.169.254/32"}}},
		{name: "registries", in: Policy{Mode: ModeAllowlist, Registries: []string{"PyPI", "npm", "pypi"}}, want: Policy{Mode: ModeAllowlist, Registries: []string{"npm", "pypi"}}},
		{name: "offline_open", in: Policy{Mode: ModeOpen, Offline: true}, want: Policy{Mode: ModeOpen, Offline: true}},
		{name: "bad_mode", in: Policy{Mode: "bridge"}, wantErr: "not one of none, allowlist, open"},
		{name: "none_with_allow", in: Policy{Allow: []string{"pypi.org"}}, wantErr: "need mode allowlist or open"},
		{name: "name_in_open", in: Policy{Mode: ModeOpen, Allow: []string{"pypi.org"}}, wantErr: "names have no effect in open mode"},
		{name: "host_bits", in: Policy{Mode: ModeAllowlist, Allow: []string{"10.1.2.3/8"}}, wantErr: "did you mean 10.0.0.0/8"},
		{name: "ipv6", in: Policy{Mode: ModeAllowlist, Allow: []string{"fc00::/7"}}, wantErr: "ipv6"},
		{name: "ipv6_bracket", in: Policy{Mode: ModeAllowlist, Allow: []string{"[::1]:443"}}, wantErr: "ipv6"},
		{name: "bad_port", in: Policy{Mode: ModeAllowlist, Allow: []string{"10.0.0.0/8:99999"}}, wantErr: "port must be"},
		{name: "zero_port", in: Policy{Mode: ModeAllowlist, Allow: []string{"1.2.3.4:0"}}, wantErr: "port must be"},
		{name: "name_port", in: Policy{Mode: ModeAllowlist, Allow: []string{"pypi.org:8443"}}, wantErr: "ports are only supported"},
		{name: "bare_star", in: Policy{Mode: ModeAllowlist, Allow: []string{"*"}}, wantErr: "not a fully qualified"},
		{name: "tld_wildcard", in: Policy{Mode: ModeAllowlist, Allow: []string{"*.com"}}, wantErr: "second-level"},
		{name: "inner_wildcard", in: Policy{Mode: ModeAllowlist, Allow: []string{"a.*.com"}}, wantErr: "invalid character"},
		{name: "single_label", in: Policy{Mode: ModeAllowlist, Allow: []string{"localhost"}}, wantErr: "fully qualified"},
		{name: "bad_prefix_len", in: Policy{Mode: ModeAllowlist, Allow: []string{"10.0.0.0/33"}}, wantErr: "prefix length"},
		{name: "bad_address", in: Policy{Mode: ModeAllowlist, Allow: []string{"10.0.0/8"}}, wantErr: "not an ipv4 address"},
		{name: "empty_entry", in: Policy{Mode: ModeAllowlist, Allow: []string{" "}}, wantErr: "empty"},
		{name: "unknown_registry", in: Policy{Mode: ModeAllowlist, Registries: []string{"cpan"}}, wantErr: "not one of"},
		{name: "registry_open", in: Policy{Mode: ModeOpen, Registries: []string{"pypi"}}, wantErr: "registries need mode allowlist"},
		{name: "registry_offline", in: Policy{Mode: ModeAllowlist, Registries: []string{"pypi"}, Offline: true}, wantErr: "offline"},
		{name: "too_many", in: Policy{Mode: ModeAllowlist, Allow: manyEntries(maxAllowEntries + 1)}, wantErr: "at most"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParsePolicy(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				if !errdefs.IsInvalidArgument(err) {
					t.Fatalf("err = %v, want class invalid argument", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Mode != tc.want.Mode || !slices.Equal(got.Allow, tc.want.Allow) || !slices.Equal(got.Registries, tc.want.Registries) || got.Offline != tc.want.Offline {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
			// Normalized output parses to itself.
			again, err := ParsePolicy(got)
			if err != nil || !slices.Equal(again.Allow, got.Allow) {
				t.Fatalf("reparse: %+v, %v", again, err)
			}
		})
	}
}

func manyEntries(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = netip.AddrFrom4([4]byte{1, 2, byte(i >> 8), byte(i)}).String()
	}
	return out
}

func TestNameVerdict(t *testing.T) {
	regs := map[string][]string{"pypi": {"pypi.test", "*.pythonhosted.test"}}
	tests := []struct {
		name       string
		policy     Policy
		query      string
		allowed    bool
		wantReason string
	}{
		{"exact", Policy{Mode: ModeAllowlist, Allow: []string{"pypi.org"}}, "pypi.org", true, ReasonAllowed},
		{"exact_no_subdomain", Policy{Mode: ModeAllowlist, Allow: []string{"pypi.org"}}, "www.pypi.org", false, ReasonNotAllowed},
		{"wildcard_sub", Policy{Mode: ModeAllowlist, Allow: []string{"*.example.com"}}, "a.example.com", true, ReasonAllowed},
		{"wildcard_deep", Policy{Mode: ModeAllowlist, Allow: []string{"*.example.com"}}, "a.b.example.com", true, ReasonAllowed},
		{"wildcard_not_apex", Policy{Mode: ModeAllowlist, Allow: []string{"*.example.com"}}, "example.com", false, ReasonNotAllowed},
		{"wildcard_not_suffix_lookalike", Policy{Mode: ModeAllowlist, Allow: []string{"*.example.com"}}, "badexample.com", false, ReasonNotAllowed},
		{"cidr_only", Policy{Mode: ModeAllowlist, Allow: []string{"10.0.0.0/8"}}, "pypi.org", false, ReasonNotAllowed},
		{"open", Policy{Mode: ModeOpen}, "anything.test", true, ReasonAllowed},
		{"none", Policy{Mode: ModeNone}, "pypi.org", false, ReasonNotAllowed},
		{"registry", Policy{Mode: ModeAllowlist, Registries: []string{"pypi"}}, "files.pythonhosted.test", true, ReasonAllowed},
		{"offline_open", Policy{Mode: ModeOpen, Offline: true}, "pypi.test", false, ReasonOffline},
		{"offline_other_name", Policy{Mode: ModeOpen, Offline: true}, "example.test", true, ReasonAllowed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := ParsePolicy(tc.policy)
			if err != nil {
				t.Fatal(err)
			}
			c, err := compile(p, regs, BlockedRanges)
			if err != nil {
				t.Fatal(err)
			}
			ok, reason := c.nameVerdict(tc.query)
			if ok != tc.allowed || reason != tc.wantReason {
				t.Fatalf("nameVerdict(%q) = %v %q, want %v %q", tc.query, ok, reason, tc.allowed, tc.wantReason)
			}
		})
	}
}

func TestCompileUnconfiguredRegistry(t *testing.T) {
	p, err := ParsePolicy(Policy{Mode: ModeAllowlist, Registries: []string{"npm"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := compile(p, map[string][]string{}, BlockedRanges); err == nil || !errdefs.IsInvalidArgument(err) {
		t.Fatalf("err = %v, want invalid argument for a registry without hosts", err)
	}
}

func TestAddrVerdict(t *testing.T) {
	hostAddr := netip.MustParseAddr("198.51.100.1")
	m := &Manager{cfg: Config{Subnet: DefaultSubnet, SandboxRanges: []netip.Prefix{netip.MustParsePrefix("10.230.0.0/16")}, APIPorts: []uint16{7070}}, blocked: BlockedRanges}
	m.hostAddrs, m.hostAt = []netip.Addr{hostAddr}, farFuture
	tests := []struct {
		name       string
		allow      []string
		ip         string
		port       uint16
		allowed    bool
		wantReason string
	}{
		{"public", nil, "203.0.113.10", 443, true, ReasonAllowed},
		{"metadata", nil, "169.254.169.254", 80, false, ReasonPrivate},
		{"private", nil, "10.1.2.3", 443, false, ReasonPrivate},
		{"cgnat", nil, "100.64.1.1", 443, false, ReasonPrivate},
		{"loopback", nil, "127.0.0.1", 80, false, ReasonPrivate},
		{"zero_net", nil, "0.0.0.0", 80, false, ReasonPrivate},
		{"sandbox_subnet", []string{"10.0.0.0/8"}, "10.231.0.6", 80, false, ReasonOtherSandbox},
		{"other_daemons_sandbox_subnet", []string{"10.0.0.0/8"}, "10.230.16.6", 80, false, ReasonOtherSandbox},
		{"private_opened_by_inner_cidr", []string{"10.1.0.0/16"}, "10.1.2.3", 443, true, ReasonAllowed},
		{"private_not_opened_by_broad_cidr", []string{"0.0.0.0/0"}, "10.1.2.3", 443, false, ReasonPrivate},
		{"private_cidr_other_port", []string{"10.1.0.0/16:5432"}, "10.1.2.3", 443, false, ReasonPrivate},
		{"private_cidr_port", []string{"10.1.0.0/16:5432"}, "10.1.2.3", 5432, true, ReasonAllowed},
		{"host", nil, "198.51.100.1", 80, false, ReasonHost},
		{"host_broad_cidr", []string{"198.51.100.0/24"}, "198.51.100.1", 80, false, ReasonHost},
		{"host_explicit", []string{"198.51.100.1"}, "198.51.100.1", 80, true, ReasonAllowed},
		{"host_explicit_not_api", []string{"198.51.100.1"}, "198.51.100.1", 7070, false, ReasonHost},
		{"host_explicit_api_port", []string{"198.51.100.1:7070"}, "198.51.100.1", 7070, true, ReasonAllowed},
		{"ipv6", nil, "2001:db8::1", 443, false, ReasonPrivate},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mode := ModeOpen
			p, err := ParsePolicy(Policy{Mode: mode, Allow: tc.allow})
			if err != nil {
				t.Fatal(err)
			}
			c, err := compile(p, nil, BlockedRanges)
			if err != nil {
				t.Fatal(err)
			}
			ok, reason := m.addrVerdict(c, netip.MustParseAddr(tc.ip), tc.port)
			if ok != tc.allowed || reason != tc.wantReason {
				t.Fatalf("addrVerdict(%s:%d) = %v %q, want %v %q", tc.ip, tc.port, ok, reason, tc.allowed, tc.wantReason)
			}
		})
	}
}

func TestPickTarget(t *testing.T) {
	pub1, pub2, priv := netip.MustParseAddr("203.0.113.1"), netip.MustParseAddr("203.0.113.2"), netip.MustParseAddr("10.0.0.1")
	allow := func(ip netip.Addr) (bool, string) {
		if ip == priv {
			return false, ReasonPrivate
		}
		return true, ReasonAllowed
	}
	tests := []struct {
		name   string
		addrs  []netip.Addr
		orig   netip.Addr
		want   netip.Addr
		reason string
	}{
		{"keeps_dialled", []netip.Addr{pub1, pub2}, pub2, pub2, ""},
		{"first_allowed_when_dialled_foreign", []netip.Addr{priv, pub1, pub2}, netip.MustParseAddr("198.51.100.9"), pub1, ""},
		{"none_allowed", []netip.Addr{priv}, priv, netip.Addr{}, ReasonRebind},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, reason := pickTarget(tc.addrs, netip.AddrPortFrom(tc.orig, 443), allow)
			if got != tc.want || reason != tc.reason {
				t.Fatalf("pickTarget = %v %q, want %v %q", got, reason, tc.want, tc.reason)
			}
		})
	}
}

func TestDefaultRegistries(t *testing.T) {
	t.Setenv("GOPROXY", "https://goproxy.example.test,direct")
	t.Setenv("NPM_CONFIG_REGISTRY", "")
	t.Setenv("npm_config_registry", "")
	t.Setenv(RegistryEnvPrefix+"NPM", "npm.example.test, *.npmcdn.example.test")
	got := DefaultRegistries(map[string][]string{"debian": {"deb.example.test"}})
	want := map[string][]string{
		"pypi":    {"pypi.org", "files.pythonhosted.org"},
		"goproxy": {"goproxy.example.test"},
		"npm":     {"npm.example.test", "*.npmcdn.example.test"},
		"debian":  {"deb.example.test"},
	}
	for k, v := range want {
		if !slices.Equal(got[k], v) {
			t.Errorf("registry %s = %v, want %v", k, got[k], v)
		}
	}
}

func TestSensitiveEntry(t *testing.T) {
	host := []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("192.0.2.7"), netip.MustParseAddr("10.9.8.7")}
	tests := []struct {
		allow []string
		entry string // "" for none
		why   string
	}{
		{[]string{"pypi.org", "203.0.113.0/24", "0.0.0.0/0", "192.0.2.0/24"}, "", ""},
		{[]string{"169.254.169.254"}, "169.254.169.254", "link-local"},
		{[]string{"pypi.org", "169.254.0.0/16:80"}, "169.254.0.0/16:80", "link-local"},
		{[]string{"169.254.170.2:80"}, "169.254.170.2:80", "cloud metadata"},
		{[]string{"169.0.0.0/8"}, "", ""}, // opens no link-local address: blocked ranges come first
		{[]string{"100.64.0.0/10"}, "100.64.0.0/10", "100.100.100.200"},
		{[]string{"192.0.2.7:7070"}, "192.0.2.7:7070", "host's own address 192.0.2.7"},
		{[]string{"10.0.0.0/8"}, "10.0.0.0/8", "10.9.8.7"},
		{[]string{"127.0.0.0/8"}, "127.0.0.0/8", "127.0.0.1"},
	}
	for _, tt := range tests {
		// As the request gave it, so that the refusal names its entry.
		entry, why := SensitiveEntry(Policy{Mode: ModeAllowlist, Allow: tt.allow}, host)
		if entry != tt.entry || !strings.Contains(why, tt.why) {
			t.Errorf("%v: got %q (%s), want %q (%s)", tt.allow, entry, why, tt.entry, tt.why)
		}
	}
}
