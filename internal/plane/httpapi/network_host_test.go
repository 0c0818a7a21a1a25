package httpapi_test

import (
	"errors"
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/api"
)

// hostNet is fakeNet on a host with addresses, as network.Manager tells
// the manager (HostAddrs).
type hostNet struct {
	*fakeNet
	addrs []netip.Addr
}

func (h hostNet) HostAddrs() []netip.Addr { return h.addrs }

// TestNetworkSensitiveEntriesNeedAdmin is issue 13 point 4: a tenant's
// allow list cannot open cloud metadata, link-local addresses or the
// host's own addresses (where the API listens): 400 naming the entry, at
// create and on update, and nothing changes. An admin key may, also
// through the tenant's default network.
func TestNetworkSensitiveEntriesNeedAdmin(t *testing.T) {
	fn := newFakeNet()
	hn := hostNet{fakeNet: fn, addrs: []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("192.0.2.7")}}
	h := newHarness(t, withNetwork(hn, testRegistries), withAudit())
	fn.drv = h.drv
	acme := h.key("acme")
	sb := h.create("acme", api.CreateSandboxRequest{Network: &api.Network{Mode: "allowlist", Allow: []string{"203.0.113.0/24"}}})

	for _, entry := range []string{"169.254.169.254", "169.254.0.0/16:80", "100.64.0.0/10", "192.0.2.7:7070", "192.0.2.7", "127.0.0.0/8"} {
		t.Run(strings.NewReplacer("/", "_", ":", "_").Replace(entry), func(t *testing.T) {
			for _, mode := range []string{"allowlist", "open"} {
				n := &api.Network{Mode: mode, Allow: []string{"203.0.113.0/24", entry}}
				r := h.req("POST", "/v1/sandboxes", acme, api.CreateSandboxRequest{Network: n})
				h.expect(r, http.StatusBadRequest, api.CodeInvalidArgument)
				if e := r.apiErr(t); !strings.Contains(e.Message, `"`+entry+`"`) || !strings.Contains(e.Message, "admin") {
					t.Fatalf("create: message %q does not name %q", e.Message, entry)
				}
				// Entries without a mode go with the default mode: checked too.
				h.expect(h.req("POST", "/v1/sandboxes", acme, api.CreateSandboxRequest{Network: &api.Network{Allow: []string{entry}}}),
					http.StatusBadRequest, api.CodeInvalidArgument)
				r = h.req("PUT", "/v1/sandboxes/"+sb.ID+"/network", acme, n)
				h.expect(r, http.StatusBadRequest, api.CodeInvalidArgument)
				if e := r.apiErr(t); !strings.Contains(e.Message, `"`+entry+`"`) {
					t.Fatalf("update: message %q does not name %q", e.Message, entry)
				}
			}
		})
	}
	if p, _ := fn.policy(sb.ID); len(p.Allow) != 1 {
		t.Fatalf("a refused update changed the policy: %+v", p)
	}
	// Entries that open none of them pass.
	h.expect(h.req("PUT", "/v1/sandboxes/"+sb.ID+"/network", acme, api.Network{Mode: "open", Allow: []string{"0.0.0.0/0", "169.0.0.0/8", "192.0.2.0/24:22"}}),
		http.StatusOK, "")

	// An admin may.
	meta := api.Network{Mode: "allowlist", Allow: []string{"169.254.169.254:80"}}
	h.expect(h.req("PUT", "/v1/sandboxes/"+sb.ID+"/network", h.admin, meta), http.StatusOK, "")
	if p, _ := fn.policy(sb.ID); len(p.Allow) != 1 || p.Allow[0] != "169.254.169.254/32:80" {
		t.Fatalf("admin's update: %+v", p)
	}
	// So does a tenant default an admin set: the tenant's creates get it.
	h.expect(h.req("PUT", "/v1/tenants/acme/network", h.admin, meta), http.StatusOK, "")
	sb2 := h.create("acme", api.CreateSandboxRequest{})
	if sb2.Network.Mode != "allowlist" || len(sb2.Network.Allow) != 1 {
		t.Fatalf("sandbox with the admin's default: %+v", sb2.Network)
	}
}

// TestNetworkLostIsReported is issue 13 point 5: a sandbox whose network
// the backend reports lost (broken from outside beyond repair) is never
// left running: it ends in state error with code network_lost, its
// runtime and network removed. A repaired one keeps running, audited.
func TestNetworkLostIsReported(t *testing.T) {
	h, fn := newNetHarness(t)
	acme := h.key("acme")
	sb := h.create("acme", api.CreateSandboxRequest{Network: &api.Network{Mode: "allowlist", Allow: []string{"203.0.113.0/24"}}})
	other := h.create("acme", api.CreateSandboxRequest{Network: &api.Network{Mode: "allowlist", Allow: []string{"203.0.113.0/24"}}})

	h.attr.NetworkRepaired(other.ID, "veth al1v3 missing")
	if got := h.state("acme", other.ID); got.State != api.StateRunning {
		t.Fatalf("a repaired sandbox is %s", got.State)
	}
	evs := h.auditAll(acme, "type=network_update&sandbox_id="+other.ID, 0)
	if len(evs) != 1 || !strings.Contains(string(evs[0].Detail), `"repaired":"veth al1v3 missing"`) {
		t.Fatalf("repair events %+v", evs)
	}

	h.attr.NetworkLost(sb.ID, errors.New("its network namespace is no longer mounted"))
	// The attribution hands it to the manager, which ends the sandbox.
	eventually(t, "the lost network's sandbox to end", func() bool { return h.state("acme", sb.ID).State == api.StateError })
	got := h.state("acme", sb.ID)
	if got.State != api.StateError || got.Error == nil || got.Error.Code != api.SandboxCodeNetworkLost || strings.Contains(got.Error.Message, "mounted") {
		t.Fatalf("after the network was lost: %s %+v", got.State, got.Error)
	}
	if _, ok := fn.policy(sb.ID); ok || h.liveInDriver() != 1 {
		t.Fatalf("network or runtime left: network %v, live %d", ok, h.liveInDriver())
	}
	if got := h.state("acme", other.ID); got.State != api.StateRunning {
		t.Fatalf("the other sandbox is %s", got.State)
	}
	// Reported twice, or for an unknown sandbox: nothing more happens.
	h.attr.NetworkLost(sb.ID, errors.New("again"))
	h.attr.NetworkLost("sbx_nosuch", errors.New("unknown"))
}
