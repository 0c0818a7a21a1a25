package e2b

import (
	"net/http"
	"net/netip"
	"slices"
	"strings"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/auth"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// allTraffic is the SDKs' ALL_TRAFFIC: denyOut of it is "deny by default".
const allTraffic = "0.0.0.0/0"

// networkConfig is E2B's SandboxNetworkConfig (create) and
// SandboxNetworkUpdateConfig (PUT /sandboxes/{id}/network).
type networkConfig struct {
	AllowOut            []string       `json:"allowOut,omitempty"`
	DenyOut             []string       `json:"denyOut,omitempty"`
	AllowPublicTraffic  *bool          `json:"allowPublicTraffic,omitempty"`
	MaskRequestHost     string         `json:"maskRequestHost,omitempty"`
	Rules               map[string]any `json:"rules,omitempty"`
	EgressProxy         map[string]any `json:"egressProxy,omitempty"`
	AllowInternetAccess *bool          `json:"allow_internet_access,omitempty"`
}

// policyOf maps E2B's egress rules onto airlock's policy, which denies by
// default and allows names and CIDRs (api.Network):
//
//   - allowInternet false, or denyOut naming all traffic: allowlist of
//     allowOut (none when it is empty), as E2B's "allowed entries take
//     precedence over denied ones";
//   - allowOut alone: the allowlist of allowOut (airlock does not open a
//     sandbox to the internet unless asked);
//   - allowInternet true, nothing else: open;
//   - denyOut of some addresses only (deny these, allow the rest): refused,
//     airlock has no deny list, and never silently allows what was denied;
//   - header transforms and egress proxies: refused, never ignored.
//
// nil (no rules at all) leaves the tenant's or server's default.
func policyOf(c *networkConfig, allowInternet *bool) (*api.Network, error) {
	if c == nil {
		c = &networkConfig{}
	}
	if allowInternet == nil {
		allowInternet = c.AllowInternetAccess
	}
	if len(c.Rules) > 0 || len(c.EgressProxy) > 0 {
		return nil, errf(errdefs.ErrCapabilityUnsupported, "network rules that transform requests and egress proxies are not available on this server")
	}
	denyAll := allowInternet != nil && !*allowInternet
	for _, d := range c.DenyOut {
		if d == allTraffic {
			denyAll = true
			continue
		}
		if _, err := netip.ParsePrefix(d); err != nil {
			if _, err := netip.ParseAddr(d); err != nil {
				return nil, errf(errdefs.ErrInvalidArgument, "denyOut entry %q is not an IP address or CIDR", d)
			}
		}
	}
	allow := slices.Clone(c.AllowOut)
	for i, a := range allow {
		// A bare address is a /32 for airlock's policy.
		if ad, err := netip.ParseAddr(a); err == nil && ad.Is4() {
			allow[i] = a + "/32"
		}
		allow[i] = strings.TrimSpace(allow[i])
	}
	switch {
	case len(c.DenyOut) > 0 && !denyAll:
		return nil, errf(errdefs.ErrCapabilityUnsupported,
			"denyOut of some addresses only is not available on this server: airlock denies by default; deny all traffic (0.0.0.0/0) and list what is allowed in allowOut")
	case denyAll || len(allow) > 0:
		if len(allow) == 0 {
			return &api.Network{Mode: "none"}, nil
		}
		return &api.Network{Mode: "allowlist", Allow: allow}, nil
	case allowInternet != nil && *allowInternet:
		return &api.Network{Mode: "open"}, nil
	}
	return nil, nil
}

// updateNetwork serves PUT /sandboxes/{id}/network: the sandbox's egress
// rules replaced (an omitted field is cleared: with none left, the
// sandbox is open, as E2B's default).
func (h *Handler) updateNetwork(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	var body networkConfig
	if err := decodeJSON(r, &body); err != nil {
		return err
	}
	if _, err := h.visible(r, p, r.PathValue("id")); err != nil {
		return err
	}
	n, err := policyOf(&body, nil)
	if err != nil {
		return err
	}
	if n == nil {
		n = &api.Network{Mode: "open"}
	}
	if _, err := h.sandboxes.UpdateNetwork(r.Context(), p, r.PathValue("id"), *n); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
