package client

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/airlockhq/airlock/api"
)

// Identity is who the Client's API key is (WhoAmI).
type Identity struct {
	// URL is the server the Client talks to.
	URL string `json:"url"`
	// Tenant is the key's tenant (an admin key's is the admin tenant).
	Tenant string `json:"tenant"`
	// Admin says the key acts on every tenant and manages keys.
	Admin bool `json:"admin"`
	// KeyID, KeyName and Prefix describe the key; KeyID is "" when the key
	// cannot be told from another key of the tenant with the same prefix.
	KeyID   string `json:"key_id,omitempty"`
	KeyName string `json:"key_name,omitempty"`
	Prefix  string `json:"prefix,omitempty"`
	// RateLimitRPS and RateLimitBurst are the key's own request limit, when
	// it has one.
	RateLimitRPS   *float64 `json:"rate_limit_rps,omitempty"`
	RateLimitBurst *int     `json:"rate_limit_burst,omitempty"`
}

// WhoAmI tells who the Client's API key is: its tenant, whether it is an
// admin key, its id and name. The server lists the keys the caller may see
// (GET /v1/keys, never their secrets) with the first characters of each
// (prefix); the key is the live one whose prefix it starts with.
func (c *Client) WhoAmI(ctx context.Context) (*Identity, error) {
	if c.apiKey == "" {
		return nil, &APIError{Code: api.CodeUnauthenticated, Message: "no API key: set AIRLOCK_API_KEY"}
	}
	keys, err := c.ListKeys(ctx)
	if err != nil {
		return nil, err
	}
	id := &Identity{URL: c.BaseURL()}
	var match []api.Key
	for _, k := range keys {
		if k.RevokedAt != nil || k.Prefix == "" || !strings.HasPrefix(c.apiKey, k.Prefix) {
			continue
		}
		switch {
		case len(match) == 0 || len(k.Prefix) == len(match[0].Prefix):
			match = append(match, k)
		case len(k.Prefix) > len(match[0].Prefix):
			match = []api.Key{k}
		}
	}
	switch {
	case len(match) == 1:
		k := match[0]
		id.Tenant, id.Admin, id.KeyID, id.KeyName, id.Prefix = k.Tenant, k.Admin, k.ID, k.Name, k.Prefix
		id.RateLimitRPS, id.RateLimitBurst = k.RateLimitRPS, k.RateLimitBurst
		return id, nil
	case len(match) > 1:
		// Keys of one prefix: still one tenant and kind, or no answer.
		for _, k := range match[1:] {
			if k.Tenant != match[0].Tenant || k.Admin != match[0].Admin {
				return nil, fmt.Errorf("whoami: %d keys start like this one, of different tenants", len(match))
			}
		}
		id.Tenant, id.Admin, id.Prefix = match[0].Tenant, match[0].Admin, match[0].Prefix
		return id, nil
	}
	// A server that lists no prefixes, or a key it does not list.
	return nil, errors.New("whoami: the server lists no key like this one")
}
