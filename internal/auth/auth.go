// Package auth issues, stores (hashed) and checks airlock API keys and says which tenant a request acts for.
//
// A key is `ak_` followed by 52 base32 characters (32 random bytes), or, in
// E2B's format for SDKs that check it, `e2b_` followed by 40 hex digits (20
// random bytes). Only its sha256 is stored, and a key is found by that hash
// whatever its format; the secret is shown once, when the key is created. A
// request presents it as `Authorization: Bearer <key>` or `X-API-Key: <key>`.
// There is no cache, so a revocation is effective on the next request.
//
// Every authenticated request also takes a token from its key's bucket
// (ratelimit.go): the key's own rate limit, or the server's default.
package auth

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base32"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/lazyregexp"
	"github.com/airlockhq/airlock/internal/quota"
	"github.com/airlockhq/airlock/internal/store"
)

// KeyPrefix starts every key airlock issues, so that secret scanners and
// people can recognise one.
const KeyPrefix = "ak_"

// AdminTenant is the tenant of the bootstrap admin key.
const AdminTenant = "admin"

// EnvAdminKeyName is the name of the key that AIRLOCK_ADMIN_KEY sets.
const EnvAdminKeyName = "AIRLOCK_ADMIN_KEY"

// minEnvKeyLen is the shortest admin key accepted from the environment: a
// shorter one could be guessed.
const minEnvKeyLen = 24

// b32 is lowercase-friendly base32 without padding (RFC 4648 alphabet).
var b32 = base32.StdEncoding.WithPadding(base32.NoPadding)

// Principal is who a request acts as.
type Principal struct {
	KeyID  string
	Tenant string
	// Admin may act on every tenant and manage keys.
	Admin bool
	// RateLimit is the key's request rate limit (its own or the default).
	RateLimit RateLimit
}

// CanSee reports whether p may act on a resource of tenant.
func (p Principal) CanSee(tenant string) bool { return p.Admin || p.Tenant == tenant }

// TenantFilter is the tenant to restrict queries to: "" (all) for admins.
func (p Principal) TenantFilter() string {
	if p.Admin {
		return ""
	}
	return p.Tenant
}

type ctxKey struct{}

// WithPrincipal returns ctx carrying p.
func WithPrincipal(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, ctxKey{}, p)
}

// FromContext returns the principal of ctx, if any.
func FromContext(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(ctxKey{}).(Principal)
	return p, ok
}

// Hash returns the stored form of a key secret.
func Hash(secret string) []byte {
	h := sha256.Sum256([]byte(secret))
	return h[:]
}

// RandomID returns prefix followed by n bytes of randomness in base32
// (unguessable ids: sbx_, ex_, key_, req_).
func RandomID(prefix string, n int) string {
	b := make([]byte, n)
	rand.Read(b) // crypto/rand.Read never fails on Linux (getrandom)
	return prefix + strings.ToLower(b32.EncodeToString(b))
}

// E2BKeyPrefix starts every key in E2B's format.
const E2BKeyPrefix = "e2b_"

// KeyFormat is the shape of a key's secret. Both formats are keys of
// airlock, accepted by every plane alike: the format only decides what the
// secret looks like.
type KeyFormat string

const (
	// FormatNative is `ak_` and 52 base32 characters (256 bits).
	FormatNative KeyFormat = "native"
	// FormatE2B is `e2b_` and 40 lowercase hex digits (160 bits): the
	// shape of E2B's own keys, which E2B's Python SDK checks
	// (`^e2b_[0-9a-f]+$`) before it sends a request unless
	// E2B_VALIDATE_API_KEY=false. The npm SDK makes no such check.
	FormatE2B KeyFormat = "e2b"
)

// e2bKeyBytes is the randomness of an E2B-format key: 40 hex digits, the
// length of E2B's keys and of the example its SDK prints.
const e2bKeyBytes = 20

// ParseKeyFormat returns the format named s; "" is FormatNative.
func ParseKeyFormat(s string) (KeyFormat, error) {
	switch KeyFormat(s) {
	case "", FormatNative:
		return FormatNative, nil
	case FormatE2B:
		return FormatE2B, nil
	}
	return "", errdefs.Wrap(errdefs.ErrInvalidArgument, "format must be %q or %q", FormatNative, FormatE2B)
}

// NewSecret returns a new key secret in the native format and its display
// prefix.
func NewSecret() (secret, prefix string) { return NewSecretOf(FormatNative) }

// NewSecretOf returns a new key secret of format f and its display prefix.
func NewSecretOf(f KeyFormat) (secret, prefix string) {
	if f == FormatE2B {
		b := make([]byte, e2bKeyBytes)
		rand.Read(b) // crypto/rand.Read never fails on Linux (getrandom)
		secret = E2BKeyPrefix + hex.EncodeToString(b)
	} else {
		secret = RandomID(KeyPrefix, 32)
	}
	return secret, DisplayPrefix(secret)
}

// displayChars is how much of a key's random part its display prefix shows.
const displayChars = 6

// DisplayPrefix returns the part of secret that key listings show (its
// format's prefix and 6 characters), or "" if secret is not shaped like a
// key airlock issues: never more of a key than listings already show.
func DisplayPrefix(secret string) string {
	for _, p := range []string{KeyPrefix, E2BKeyPrefix} {
		if strings.HasPrefix(secret, p) && len(secret) > len(p)+displayChars {
			return secret[:len(p)+displayChars]
		}
	}
	return ""
}

// tenantRE is what a tenant name may look like: it shows up in logs, metrics
// and directory names, so keep it plain.
var tenantRE = lazyregexp.New(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// ValidTenant reports whether name is an acceptable tenant name.
func ValidTenant(name string) bool { return tenantRE.MatchString(name) }

// Authenticator checks request keys against the store.
type Authenticator struct {
	store *store.Store
	now   func() time.Time

	// limits is the default rate limit (a RateLimit), swapped whole.
	limits  atomic.Pointer[RateLimit]
	buckets *quota.Buckets

	// watchers are the channels Revoked handed out, by key id, closed when
	// that key is revoked, so that streams it opened end at once too.
	watchMu  sync.Mutex
	watchers map[string]map[chan struct{}]struct{}
	// revoked are the keys revoked through this Authenticator: a stream
	// whose request was authenticated just before its key was revoked,
	// and that watches only after, ends at once too.
	revoked map[string]bool
}

// Option configures an Authenticator.
type Option func(*Authenticator)

// WithClock makes the Authenticator read time from now (tests).
func WithClock(now func() time.Time) Option { return func(a *Authenticator) { a.now = now } }

// WithRateLimit sets the default request rate limit of keys that have no
// limit of their own; without it there is none.
func WithRateLimit(l RateLimit) Option { return func(a *Authenticator) { a.SetDefaultRateLimit(l) } }

// New returns an Authenticator backed by st.
func New(st *store.Store, opts ...Option) *Authenticator {
	a := &Authenticator{store: st, now: time.Now}
	a.limits.Store(&RateLimit{})
	for _, o := range opts {
		o(a)
	}
	a.buckets = quota.NewBuckets(func() time.Time { return a.now() })
	return a
}

// ErrNoKey is returned when a request carries no key at all.
var ErrNoKey = fmt.Errorf("%w: missing api key", errdefs.ErrUnauthenticated)

// ErrBadKey is returned for an unknown, malformed or revoked key. One error
// for all three, so a caller cannot probe which keys exist.
var ErrBadKey = fmt.Errorf("%w: invalid api key", errdefs.ErrUnauthenticated)

// KeyFromRequest extracts the presented key: `Authorization: Bearer` first,
// then `X-API-Key`. "" when neither is present.
func KeyFromRequest(r *http.Request) string {
	if h := r.Header.Get("Authorization"); h != "" {
		scheme, rest, ok := strings.Cut(h, " ")
		if ok && strings.EqualFold(scheme, "Bearer") {
			return strings.TrimSpace(rest)
		}
		return ""
	}
	return strings.TrimSpace(r.Header.Get("X-API-Key"))
}

// Authenticate returns the principal of the key r presents, and takes a
// token from that key's rate limit: a key over its limit gets a
// *RateLimitError (class errdefs.ErrRateLimited) inside an
// *errdefs.Public with its Retry-After, not its principal.
func (a *Authenticator) Authenticate(ctx context.Context, r *http.Request) (Principal, error) {
	secret := KeyFromRequest(r)
	if secret == "" {
		if r.Header.Get("Authorization") != "" {
			return Principal{}, ErrBadKey // present but not a bearer token
		}
		return Principal{}, ErrNoKey
	}
	p, err := a.Check(ctx, secret)
	if err != nil {
		return Principal{}, err
	}
	if err := a.take(p); err != nil {
		return Principal{}, err
	}
	return p, nil
}

// Check returns the principal of key secret.
func (a *Authenticator) Check(ctx context.Context, secret string) (Principal, error) {
	if len(secret) > 512 {
		return Principal{}, ErrBadKey
	}
	h := Hash(secret)
	k, err := a.store.KeyByHash(ctx, h)
	if errdefs.IsNotFound(err) {
		return Principal{}, ErrBadKey
	}
	if err != nil {
		return Principal{}, fmt.Errorf("checking api key: %w", err)
	}
	// The lookup matched on the hash already; comparing again in constant
	// time keeps the decision itself free of data-dependent timing.
	if subtle.ConstantTimeCompare(k.Hash, h) != 1 || k.RevokedAt != nil {
		return Principal{}, ErrBadKey
	}
	return Principal{KeyID: k.ID, Tenant: k.Tenant, Admin: k.Admin, RateLimit: a.limitOf(k)}, nil
}

// Key is an API key's record (never its secret), as the key routes show it.
type Key = store.Key

// Created is a newly created key with its secret, shown once.
type Created struct {
	store.Key
	Secret string
}

// KeyOption sets an optional property of a key at its creation.
type KeyOption func(*newKey) error

// newKey is a key being created: its record and the format of its secret.
type newKey struct {
	store.Key
	format KeyFormat
}

// KeyFormatOf gives the key's secret the format named format ("" is
// native; ParseKeyFormat).
func KeyFormatOf(format string) KeyOption {
	return func(k *newKey) error {
		f, err := ParseKeyFormat(format)
		k.format = f
		return err
	}
}

// KeyRateLimit gives the key its own rate limit: rps requests per second
// (0: no limit) with a burst of burst. Either may be nil to keep the
// server's default for it.
func KeyRateLimit(rps *float64, burst *int) KeyOption {
	return func(k *newKey) error {
		if rps != nil {
			if math.IsNaN(*rps) || *rps < 0 || *rps > maxRateLimitRPS {
				return errdefs.Wrap(errdefs.ErrInvalidArgument, "rate_limit_rps must be between 0 (no limit) and %d", maxRateLimitRPS)
			}
			v := *rps
			k.RateLimitRPS = &v
		}
		if burst != nil {
			if *burst < 1 || *burst > maxRateLimitBurst {
				return errdefs.Wrap(errdefs.ErrInvalidArgument, "rate_limit_burst must be between 1 and %d", maxRateLimitBurst)
			}
			v := *burst
			k.RateLimitBurst = &v
		}
		return nil
	}
}

// CreateKey issues a key for tenant.
func (a *Authenticator) CreateKey(ctx context.Context, tenant, name string, admin bool, opts ...KeyOption) (Created, error) {
	if !ValidTenant(tenant) {
		return Created{}, errdefs.Wrap(errdefs.ErrInvalidArgument, "tenant must match %s", tenantRE)
	}
	if len(name) > 128 {
		return Created{}, errdefs.Wrap(errdefs.ErrInvalidArgument, "name is longer than 128 bytes")
	}
	k := newKey{Key: store.Key{ID: RandomID("key_", 15), Tenant: tenant, Name: name, Admin: admin, CreatedAt: a.now().UTC()},
		format: FormatNative}
	for _, o := range opts {
		if err := o(&k); err != nil {
			return Created{}, err
		}
	}
	secret, prefix := NewSecretOf(k.format)
	k.Prefix, k.Hash = prefix, Hash(secret)
	if err := a.store.CreateKey(ctx, k.Key); err != nil {
		return Created{}, err
	}
	return Created{Key: k.Key, Secret: secret}, nil
}

// Revoke revokes key id. A non-admin may revoke only keys of its own tenant;
// another tenant's key is reported as not found.
func (a *Authenticator) Revoke(ctx context.Context, p Principal, id string) error {
	k, err := a.store.GetKey(ctx, id)
	if err != nil {
		return err
	}
	if !p.CanSee(k.Tenant) {
		return fmt.Errorf("%w: key %q", errdefs.ErrNotFound, id)
	}
	if err := a.store.RevokeKey(ctx, id, a.now()); err != nil {
		return err
	}
	a.watchMu.Lock()
	for ch := range a.watchers[id] {
		close(ch)
	}
	delete(a.watchers, id)
	if a.revoked == nil {
		a.revoked = map[string]bool{}
	}
	a.revoked[id] = true
	a.watchMu.Unlock()
	return nil
}

// Revoked returns a channel that is closed when key id is revoked through
// this Authenticator (the daemon's only one), and a function that stops
// watching. Long-lived responses (event streams, terminals) end on it, so
// a revocation also cuts what the key already has open.
func (a *Authenticator) Revoked(id string) (<-chan struct{}, func()) {
	ch := make(chan struct{})
	if id == "" {
		return ch, func() {}
	}
	a.watchMu.Lock()
	if a.revoked[id] {
		a.watchMu.Unlock()
		close(ch)
		return ch, func() {}
	}
	if a.watchers == nil {
		a.watchers = map[string]map[chan struct{}]struct{}{}
	}
	if a.watchers[id] == nil {
		a.watchers[id] = map[chan struct{}]struct{}{}
	}
	a.watchers[id][ch] = struct{}{}
	a.watchMu.Unlock()
	return ch, func() {
		a.watchMu.Lock()
		if w, ok := a.watchers[id]; ok {
			delete(w, ch)
			if len(w) == 0 {
				delete(a.watchers, id)
			}
		}
		a.watchMu.Unlock()
	}
}

// List returns the keys p may see (its tenant's, or all for an admin).
func (a *Authenticator) List(ctx context.Context, p Principal) ([]store.Key, error) {
	return a.store.ListKeys(ctx, p.TenantFilter())
}

// Bootstrap makes sure an admin key exists. With envKey (AIRLOCK_ADMIN_KEY)
// set, that key becomes an admin key (an earlier env key is revoked) and
// generated is "". Otherwise, on the very first start (no admin key yet) it
// creates one and returns its secret, to be printed once; later starts
// return "".
func (a *Authenticator) Bootstrap(ctx context.Context, envKey string) (generated string, err error) {
	now := a.now().UTC()
	if envKey != "" {
		if len(envKey) < minEnvKeyLen {
			return "", errdefs.Wrap(errdefs.ErrInvalidArgument, "%s must be at least %d characters", EnvAdminKeyName, minEnvKeyLen)
		}
		h := Hash(envKey)
		k, err := a.store.KeyByHash(ctx, h)
		switch {
		case err == nil && (!k.Admin || k.RevokedAt != nil):
			return "", errdefs.Wrap(errdefs.ErrConflict, "%s matches a revoked or non-admin key", EnvAdminKeyName)
		case errdefs.IsNotFound(err):
			prefix := DisplayPrefix(envKey)
			if prefix == "" {
				prefix = envKey[:len(KeyPrefix)+displayChars] // at least minEnvKeyLen long
			}
			err = a.store.CreateKey(ctx, store.Key{ID: RandomID("key_", 15), Tenant: AdminTenant, Name: EnvAdminKeyName,
				Prefix: prefix, Hash: h, Admin: true, CreatedAt: now})
			if err != nil {
				return "", err
			}
		case err != nil:
			return "", err
		}
		return "", a.store.RevokeKeysNamed(ctx, EnvAdminKeyName, h, now)
	}
	n, err := a.store.CountAdminKeys(ctx)
	if err != nil {
		return "", err
	}
	if n > 0 {
		return "", nil
	}
	c, err := a.CreateKey(ctx, AdminTenant, "bootstrap", true)
	if err != nil {
		return "", err
	}
	return c.Secret, nil
}

// IsUnauthenticated reports whether err is an authentication failure.
func IsUnauthenticated(err error) bool { return errors.Is(err, errdefs.ErrUnauthenticated) }
