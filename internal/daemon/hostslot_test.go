package daemon

import (
	"context"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/client"
	"github.com/airlockhq/airlock/internal/hostslot"
	"github.com/airlockhq/airlock/internal/network/fakenet"
	"github.com/airlockhq/airlock/internal/testutil"
)

// The fake internet of TestTwoDaemonsOnOneHost: a "host" namespace where
// both daemons' network side lives (so their tables, veths and NFLOG
// groups meet as on one real host) and an "inet" one with a service.
const (
	sHostUp  = "198.51.100.1"
	sInetUp  = "198.51.100.254"
	sService = "203.0.113.20"
)

// egressPy connects to the fake internet's service and prints its banner.
const egressPy = `import socket
s = socket.create_connection(("` + sService + `", 5432), timeout=5)
print(s.recv(100).decode())`

// TestTwoDaemonsOnOneHost is issue 13 point 5: two airlock serve on one
// host with different data dirs, each with an allowlist sandbox. Killing
// and restarting the second leaves the first one's sandbox with its veth,
// its nftables chains and working egress; their sandboxes never share host
// uids; the second gets its own slot back and its sandbox its network; and
// a daemon on a data dir already served is refused, naming the first.
func TestTwoDaemonsOnOneHost(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real airlock serve processes and runc sandboxes")
	}
	testutil.RequiresRoot(t)
	testutil.RequiresBinary(t, "runc")
	agent, bin := buildBinaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()

	host, inet := fakenet.New(t, "host"), fakenet.New(t, "inet")
	fakenet.Link(t, host, "up0", netip.MustParsePrefix(sHostUp+"/24"), inet, "eth0", netip.MustParsePrefix(sInetUp+"/24"))
	host.DefaultRoute(t, netip.MustParseAddr(sInetUp))
	inet.AddAddr(t, "lo", netip.MustParsePrefix(sService+"/32"))
	service := inet.ServeTCP(t, sService+":5432", "db")

	dirA, leaksA := restartDataDir(t, ctx, "airlock-slot-a-")
	dirB, leaksB := restartDataDir(t, ctx, "airlock-slot-b-")
	const key = "admin-key-for-the-host-slot-test-0123"
	addrA, addrB := freeLoopbackAddr(t), freeLoopbackAddr(t)
	// No previews (their default port may be a serving daemon's), and the
	// network side in the test's host namespace.
	env := []string{"AIRLOCK_PREVIEW_LISTEN=", "AIRLOCK_SAMPLE_INTERVAL_S=5", EnvTestHostNetNS + "=" + host.Path()}
	dA := startServeEnv(t, bin, agent, dirA, addrA, key, env...)
	dB := startServeEnv(t, bin, agent, dirB, addrB, key, env...)
	cA, _ := client.New("http://"+addrA, key)
	cB, _ := client.New("http://"+addrB, key)
	var sbA, sbB *api.Sandbox
	t.Cleanup(func() {
		dctx, dcancel := context.WithTimeout(context.Background(), time.Minute)
		defer dcancel()
		for _, x := range []struct {
			c  *client.Client
			sb *api.Sandbox
			d  **servedProc
		}{{cA, sbA, &dA}, {cB, sbB, &dB}} {
			if x.sb != nil {
				if err := x.c.DeleteSandbox(dctx, x.sb.ID); err != nil {
					t.Errorf("delete %s: %v", x.sb.ID, err)
				}
			}
			if err := (*x.d).term(); err != nil {
				t.Errorf("daemon: %v", err)
			}
			if t.Failed() {
				t.Logf("daemon log:\n%s", (*x.d).logs.String())
			}
		}
		reapAdopted(t)
		leaksA.AssertNoLeaks(t)
		leaksB.AssertNoLeaks(t)
	})

	slotOf := func(dir string) hostslot.Names {
		t.Helper()
		n, ok := hostslot.Remembered(dir)
		if !ok {
			t.Fatalf("data dir %s has no host slot", dir)
		}
		got, pid, err := hostslot.Holder("", n)
		if real, _ := filepath.EvalSymlinks(dir); err != nil || got != real || pid == 0 {
			t.Fatalf("claim of slot %d: %q pid %d %v, want %s", n, got, pid, err, real)
		}
		return hostslot.NamesOf(n)
	}
	nA, nB := slotOf(dirA), slotOf(dirB)
	if nA.Slot == nB.Slot || nA.Slot == 0 || nB.Slot == 0 {
		t.Fatalf("slots %d and %d: want two different ones, neither 0 (the default data dir's)", nA.Slot, nB.Slot)
	}

	policy := &api.Network{Mode: "allowlist", Allow: []string{sService + ":5432"}}
	create := func(c *client.Client, d *servedProc) *api.Sandbox {
		t.Helper()
		sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "base", Network: policy})
		if err != nil {
			t.Fatalf("create: %v\n%s", err, d.logs.String())
		}
		return sb
	}
	sbA = create(cA, dA)
	sbB = create(cB, dB)
	egress := func(c *client.Client, sb *api.Sandbox, when string) {
		t.Helper()
		res, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"python3", "-c", egressPy}})
		if err != nil || deref(res.Stdout) != "db\n" {
			t.Fatalf("%s: egress of %s: %+v %v", when, sb.ID, res, err)
		}
	}
	egress(cA, sbA, "both created")
	egress(cB, sbB, "both created")

	// Their sandboxes' host uids are apart.
	uidBase := func(c *client.Client, sb *api.Sandbox) uint64 {
		t.Helper()
		res, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"cat", "/proc/self/uid_map"}})
		f := strings.Fields(deref(res.Stdout))
		if err != nil || len(f) != 3 {
			t.Fatalf("uid_map: %+v %v", res, err)
		}
		base, _ := strconv.ParseUint(f[1], 10, 32)
		return base
	}
	ua, ub := uidBase(cA, sbA), uidBase(cB, sbB)
	if ua < uint64(nA.RuncUIDStart) || ua >= uint64(nA.RuncUIDStart)+hostslot.UIDRanges*hostslot.IDCount ||
		ub < uint64(nB.RuncUIDStart) || ub >= uint64(nB.RuncUIDStart)+hostslot.UIDRanges*hostslot.IDCount {
		t.Fatalf("host uid bases %d and %d outside their slots' ranges (%d, %d)", ua, ub, nA.RuncUIDStart, nB.RuncUIDStart)
	}

	vethA := hostLinks(t, host, nA.IfPrefix)
	chainsA := nftChainsOf(t, host, nA.Table)
	if len(vethA) != 1 || len(chainsA) != 4+5 {
		t.Fatalf("first daemon: veths %v, chains %v", vethA, chainsA)
	}

	// Something else on the host deletes the first sandbox's veth: the
	// daemon wires it again (its checker runs every 5 s) and says so.
	deleteLink(t, host, vethA[0])
	repaired := func() bool {
		for e, err := range cA.AuditEvents(ctx, client.AuditOptions{SandboxID: sbA.ID, Types: []string{api.AuditNetworkUpdate}}) {
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(e.Detail), `"repaired"`) && strings.Contains(string(e.Detail), vethA[0]) {
				return true
			}
		}
		return false
	}
	for deadline := time.Now().Add(30 * time.Second); !repaired(); time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("veth %s not wired again\n%s", vethA[0], dA.logs.String())
		}
	}
	if got := hostLinks(t, host, nA.IfPrefix); !slices.Equal(got, vethA) {
		t.Fatalf("veths %v after the repair, want %v", got, vethA)
	}
	egress(cA, sbA, "veth repaired")

	// A second daemon on the first's data dir is refused, naming it.
	cmd := exec.CommandContext(ctx, bin, "serve", "--listen", freeLoopbackAddr(t), "--data-dir", dirA, "--agent-path", agent, "--no-prepare")
	cmd.Env = append(os.Environ(), append(env, "AIRLOCK_ADMIN_KEY="+key)...)
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "another airlock serve (pid "+strconv.Itoa(dA.cmd.Process.Pid)+")") || !strings.Contains(string(out), dirA) {
		t.Fatalf("second daemon on %s: %v\n%s", dirA, err, out)
	}

	// The second daemon dies and comes back.
	dB.kill()
	egress(cA, sbA, "second daemon killed")
	dB = startServeEnv(t, bin, agent, dirB, addrB, key, env...)
	if again := slotOf(dirB); again != nB {
		t.Fatalf("the restarted daemon got slot %d, want its slot %d", again.Slot, nB.Slot)
	}
	if got := hostLinks(t, host, nA.IfPrefix); !slices.Equal(got, vethA) {
		t.Fatalf("first daemon's veths %v after the second restarted, were %v", got, vethA)
	}
	if got := nftChainsOf(t, host, nA.Table); !slices.Equal(got, chainsA) {
		t.Fatalf("first daemon's chains %v after the second restarted, were %v", got, chainsA)
	}
	egress(cA, sbA, "second daemon restarted")
	egress(cB, sbB, "second daemon restarted")
	if got, err := cA.GetSandbox(ctx, sbA.ID); err != nil || got.State != api.StateRunning {
		t.Fatalf("first sandbox %+v %v", got, err)
	}
	if service.Hits() < 5 {
		t.Fatalf("service reached %d times", service.Hits())
	}
}

// deleteLink deletes an interface of the namespace, as another program
// on the host might.
func deleteLink(t *testing.T, ns *fakenet.NS, name string) {
	t.Helper()
	h, err := netlink.NewHandleAt(netns.NsHandle(ns.Fd()), unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	l, err := h.LinkByName(name)
	if err == nil {
		err = h.LinkDel(l)
	}
	if err != nil {
		t.Fatalf("deleting %s: %v", name, err)
	}
}

// hostLinks lists the namespace's interfaces named with prefix.
func hostLinks(t *testing.T, ns *fakenet.NS, prefix string) []string {
	var out []string
	for _, l := range ns.Links(t) {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	slices.Sort(out)
	return out
}

// nftChainsOf lists the chains of table (family inet) in the namespace.
func nftChainsOf(t *testing.T, ns *fakenet.NS, table string) []string {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(ns.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	all, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, ch := range all {
		if ch.Table.Name == table {
			out = append(out, ch.Name)
		}
	}
	slices.Sort(out)
	return out
}
