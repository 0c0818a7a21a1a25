package auth

import (
	"context"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/store"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func newAuth(t *testing.T) (*Authenticator, *store.Store) {
	t.Helper()
	st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "a.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return New(st), st
}

func TestNewSecretFormat(t *testing.T) {
	for _, tt := range []struct {
		format KeyFormat
		re     *regexp.Regexp
	}{
		{FormatNative, regexp.MustCompile(`^ak_[a-z2-7]{52}$`)},
		// What E2B's Python SDK checks (`\Ae2b_[0-9a-f]+\Z`), at the length
		// of E2B's own keys.
		{FormatE2B, regexp.MustCompile(`^e2b_[0-9a-f]{40}$`)},
	} {
		t.Run(string(tt.format), func(t *testing.T) {
			seen := map[string]bool{}
			for i := 0; i < 100; i++ {
				s, prefix := NewSecretOf(tt.format)
				if !tt.re.MatchString(s) {
					t.Fatalf("secret %q does not match %s", s, tt.re)
				}
				if !strings.HasPrefix(s, prefix) || len(prefix) != strings.Index(s, "_")+1+6 {
					t.Fatalf("prefix %q of %q", prefix, s)
				}
				if seen[s] {
					t.Fatal("duplicate secret")
				}
				seen[s] = true
			}
		})
	}
	if s, _ := NewSecret(); !strings.HasPrefix(s, KeyPrefix) {
		t.Errorf("NewSecret() = %q, want the native format", s)
	}
}

func TestDisplayPrefix(t *testing.T) {
	for _, tt := range []struct{ secret, want string }{
		{"ak_abcdefghij", "ak_abcdef"},
		{"e2b_0123456789abcdef", "e2b_012345"},
		{"ak_abcdef", ""}, // nothing but the prefix would show
		{"e2b_012", ""},
		{"sk-live-0123456789", ""},
		{"", ""},
	} {
		if got := DisplayPrefix(tt.secret); got != tt.want {
			t.Errorf("DisplayPrefix(%q) = %q, want %q", tt.secret, got, tt.want)
		}
	}
}

// TestE2BFormatKey: a key in E2B's format is an airlock key like any
// other: found by its hash wherever it is presented (the E2B SDKs send
// X-API-KEY; airlock's own clients a bearer token), scoped to its tenant,
// listed by its prefix only, revocable.
func TestE2BFormatKey(t *testing.T) {
	a, st := newAuth(t)
	ctx := context.Background()
	c, err := a.CreateKey(ctx, "acme", "sdk", false, KeyFormatOf("e2b"))
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^e2b_[0-9a-f]{40}$`).MatchString(c.Secret) || c.Prefix != c.Secret[:10] {
		t.Fatalf("secret %q, prefix %q", c.Secret, c.Prefix)
	}
	k, err := st.GetKey(ctx, c.ID)
	if err != nil || string(k.Hash) != string(Hash(c.Secret)) || k.Prefix != c.Prefix || k.Tenant != "acme" {
		t.Fatalf("stored key %+v, %v", k, err)
	}
	for _, h := range []struct{ name, value string }{
		{"X-API-KEY", c.Secret},
		{"Authorization", "Bearer " + c.Secret},
	} {
		r := httptest.NewRequest("POST", "/v2/sandboxes", nil)
		r.Header.Set(h.name, h.value)
		p, err := a.Authenticate(ctx, r)
		if err != nil || p.Tenant != "acme" || p.Admin || p.KeyID != c.ID {
			t.Errorf("%s: principal %+v, %v", h.name, p, err)
		}
	}
	// A neighbour of the secret (same prefix, one digit changed) is no key.
	last := c.Secret[len(c.Secret)-1]
	other := c.Secret[:len(c.Secret)-1] + map[bool]string{true: "1", false: "0"}[last == '0']
	if _, err := a.Check(ctx, other); !IsUnauthenticated(err) {
		t.Errorf("altered e2b key accepted: %v", err)
	}
	if err := a.Revoke(ctx, Principal{Tenant: "acme"}, c.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Check(ctx, c.Secret); !IsUnauthenticated(err) {
		t.Fatalf("revoked e2b key accepted: %v", err)
	}
	// Native stays the default, and "native" names it.
	for _, opts := range [][]KeyOption{nil, {KeyFormatOf("")}, {KeyFormatOf("native")}} {
		n, err := a.CreateKey(ctx, "acme", "", false, opts...)
		if err != nil || !strings.HasPrefix(n.Secret, KeyPrefix) {
			t.Errorf("CreateKey(%d options) = %q, %v; want a native key", len(opts), n.Secret, err)
		}
	}
}

func TestKeyFromRequest(t *testing.T) {
	tests := []struct {
		name    string
		headers map[string]string
		want    string
	}{
		{"bearer", map[string]string{"Authorization": "Bearer ak_x"}, "ak_x"},
		{"bearer-lowercase", map[string]string{"Authorization": "bearer ak_x"}, "ak_x"},
		{"x-api-key", map[string]string{"X-API-Key": "ak_y"}, "ak_y"},
		{"bearer-wins", map[string]string{"Authorization": "Bearer ak_x", "X-API-Key": "ak_y"}, "ak_x"},
		{"basic-is-not-a-key", map[string]string{"Authorization": "Basic Zm9vOmJhcg=="}, ""},
		{"none", nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "/", nil)
			for k, v := range tt.headers {
				r.Header.Set(k, v)
			}
			if got := KeyFromRequest(r); got != tt.want {
				t.Fatalf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestAuthenticateAndRevoke(t *testing.T) {
	a, st := newAuth(t)
	ctx := context.Background()
	c, err := a.CreateKey(ctx, "acme", "ci", false)
	if err != nil {
		t.Fatal(err)
	}
	// Only the hash is stored.
	k, err := st.GetKey(ctx, c.ID)
	if err != nil || strings.Contains(string(k.Hash), c.Secret) || string(k.Hash) != string(Hash(c.Secret)) {
		t.Fatalf("stored key %+v, %v", k, err)
	}
	req := func(h, v string) Principal {
		t.Helper()
		r := httptest.NewRequest("GET", "/", nil)
		if h != "" {
			r.Header.Set(h, v)
		}
		p, err := a.Authenticate(ctx, r)
		if err != nil {
			t.Fatalf("%s: %v", h, err)
		}
		return p
	}
	p := req("Authorization", "Bearer "+c.Secret)
	if p.Tenant != "acme" || p.Admin || p.KeyID != c.ID {
		t.Fatalf("principal = %+v", p)
	}
	if p2 := req("X-API-Key", c.Secret); p2 != p {
		t.Fatalf("X-API-Key principal %+v != %+v", p2, p)
	}
	bad := []struct{ name, header, value string }{
		{"missing", "", ""},
		{"unknown", "Authorization", "Bearer ak_unknown"},
		{"basic", "Authorization", "Basic abc"},
		{"wrong-case-secret", "X-API-Key", strings.ToUpper(c.Secret)},
		{"huge", "X-API-Key", strings.Repeat("a", 4096)},
	}
	for _, b := range bad {
		t.Run(b.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "/", nil)
			if b.header != "" {
				r.Header.Set(b.header, b.value)
			}
			if _, err := a.Authenticate(ctx, r); !IsUnauthenticated(err) {
				t.Fatalf("err = %v, want unauthenticated", err)
			}
		})
	}
	// Another tenant cannot revoke it: not found, and the key still works.
	other := Principal{Tenant: "evil"}
	if err := a.Revoke(ctx, other, c.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("cross-tenant revoke: %v", err)
	}
	if _, err := a.Check(ctx, c.Secret); err != nil {
		t.Fatalf("key broken by a refused revoke: %v", err)
	}
	if err := a.Revoke(ctx, p, c.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Check(ctx, c.Secret); !IsUnauthenticated(err) {
		t.Fatalf("revoked key accepted: %v", err)
	}
}

func TestCreateKeyValidation(t *testing.T) {
	a, _ := newAuth(t)
	for _, tenant := range []string{"", "UPPER", "has space", "../x", strings.Repeat("a", 64)} {
		if _, err := a.CreateKey(context.Background(), tenant, "", false); !errdefs.IsInvalidArgument(err) {
			t.Errorf("tenant %q: err = %v, want invalid argument", tenant, err)
		}
	}
	for _, f := range []string{"E2B", "e2b ", "hex", "ak"} {
		if _, err := a.CreateKey(context.Background(), "acme", "", false, KeyFormatOf(f)); !errdefs.IsInvalidArgument(err) {
			t.Errorf("format %q: err = %v, want invalid argument", f, err)
		}
	}
	if keys, _ := a.List(context.Background(), Principal{Admin: true}); len(keys) != 0 {
		t.Errorf("refused creates stored %d keys", len(keys))
	}
}

func TestBootstrapGeneratesOnce(t *testing.T) {
	a, _ := newAuth(t)
	ctx := context.Background()
	secret, err := a.Bootstrap(ctx, "")
	if err != nil || secret == "" {
		t.Fatalf("first start: %q, %v", secret, err)
	}
	p, err := a.Check(ctx, secret)
	if err != nil || !p.Admin {
		t.Fatalf("generated key: %+v, %v", p, err)
	}
	again, err := a.Bootstrap(ctx, "")
	if err != nil || again != "" {
		t.Fatalf("second start printed a key again: %q, %v", again, err)
	}
}

func TestBootstrapEnvKey(t *testing.T) {
	a, _ := newAuth(t)
	ctx := context.Background()
	if _, err := a.Bootstrap(ctx, "short"); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("short env key: %v", err)
	}
	k1 := "env-admin-key-0123456789abcdef"
	if s, err := a.Bootstrap(ctx, k1); err != nil || s != "" {
		t.Fatalf("env key: %q, %v", s, err)
	}
	if p, err := a.Check(ctx, k1); err != nil || !p.Admin {
		t.Fatalf("env key not admin: %+v, %v", p, err)
	}
	// Same key again: idempotent.
	if _, err := a.Bootstrap(ctx, k1); err != nil {
		t.Fatal(err)
	}
	// A new env key retires the old one.
	k2 := "env-admin-key-second-0123456789"
	if _, err := a.Bootstrap(ctx, k2); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Check(ctx, k1); !IsUnauthenticated(err) {
		t.Fatalf("old env key still valid: %v", err)
	}
	if _, err := a.Check(ctx, k2); err != nil {
		t.Fatal(err)
	}
	// With an admin key present no key is generated.
	if s, err := a.Bootstrap(ctx, ""); err != nil || s != "" {
		t.Fatalf("generated despite env admin key: %q, %v", s, err)
	}
	// A revoked env key may not be brought back by the environment.
	keys, _ := a.List(ctx, Principal{Admin: true})
	for _, k := range keys {
		if k.Name == EnvAdminKeyName && k.RevokedAt == nil {
			a.Revoke(ctx, Principal{Admin: true}, k.ID)
		}
	}
	if _, err := a.Bootstrap(ctx, k2); err == nil {
		t.Fatal("revoked env key re-enabled")
	}
}

// TestRevokedBeforeWatch: a stream authenticated just before its key was
// revoked, that starts watching only after, is told at once; one watching
// before is told at the revocation; another key's watch is not.
func TestRevokedBeforeWatch(t *testing.T) {
	a, _ := newAuth(t)
	ctx := context.Background()
	c, err := a.CreateKey(ctx, "acme", "doomed", false)
	if err != nil {
		t.Fatal(err)
	}
	o, err := a.CreateKey(ctx, "acme", "kept", false)
	if err != nil {
		t.Fatal(err)
	}
	early, stopEarly := a.Revoked(c.ID)
	defer stopEarly()
	other, stopOther := a.Revoked(o.ID)
	defer stopOther()
	if err := a.Revoke(ctx, Principal{Tenant: "acme"}, c.ID); err != nil {
		t.Fatal(err)
	}
	late, stopLate := a.Revoked(c.ID)
	defer stopLate()
	for name, ch := range map[string]<-chan struct{}{"watching before": early, "watching after": late} {
		select {
		case <-ch:
		default:
			t.Errorf("%s the revocation: not told", name)
		}
	}
	select {
	case <-other:
		t.Error("another key's watch was told of the revocation")
	default:
	}
}
