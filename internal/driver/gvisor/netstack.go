package gvisor

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"slices"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Network flags of runsc: netstack is gVisor's own TCP/IP stack, fed with
// the raw frames of the namespace's interfaces; none is its loopback only.
const (
	flagNetstack = "--network=sandbox"
	flagNoNet    = "--network=none"
)

// netConfigName is the file in a sandbox dir that remembers its
// namespace's addresses and routes (see restoreAddrs).
const netConfigName = "netstack.json"

// procDirName is the directory in a sandbox dir where launch binds /proc
// in runsc's mount namespace (and only there).
const procDirName = "netproc"

// Starting runsc in a namespace (Launch, with netstack). With netstack in
// a namespace the daemon prepared, runsc must start from inside that
// namespace, where it copies the interfaces' addresses and routes into
// gVisor's stack, strips them from the host side and hands the Sentry raw
// sockets on them. Two things stand in the way of Debian's runsc on this
// kernel:
//
//   - runsc tells the host's root namespace from another by whether
//     /proc/sys/net/core/rmem_default exists, which since Linux 6.x it does
//     in every namespace ("cannot run with network enabled in root network
//     namespace"). In a mount namespace of runsc's own, an empty read-only
//     tmpfs hides that directory; only runsc's own short-lived process looks
//     there (the Sentry and the Gofer build their own root and /proc). The
//     Gofer and the Sentry mount a proc of their own from inside user
//     namespaces, which the kernel allows only while the mount namespace has
//     a proc that hides nothing: a bind of /proc is made first, at a
//     directory of the sandbox that nothing else uses.
//   - runsc removes the addresses from the namespace's interfaces, so a
//     second run (a restart) would find none: they are put back from
//     netstack.json first (RunArgs, restoreAddrs).
//
// The namespaces are entered by child processes (nsenter, unshare, a shell
// that mounts and execs runsc), never by a thread of the daemon: a Go
// thread that changed namespaces may be the main one, whose view
// /proc/self shows to the whole daemon.

// nsScript runs in runsc's new mount namespace: $1 is where /proc is bound,
// the rest is runsc's command line.
const nsScript = `set -e
mount --bind /proc "$1"
mount -t tmpfs -o ro,nosuid,nodev,noexec,size=4k,mode=555 tmpfs /proc/sys/net/core
shift
exec "$@"`

// wrapInNamespaces rewrites cmd so that it runs as
// nsenter --net=NS unshare --mount --propagation slave sh -c nsScript sh VISIBLE runsc ARGS…
// Slave propagation: the host's unmounts (a torn-down sandbox) still reach
// the copy, and nothing mounted there leaks back.
func wrapInNamespaces(cmd *exec.Cmd, netnsPath, visible string) error {
	var tools [4]string
	for i, name := range []string{"nsenter", "unshare", "sh", "mount"} {
		p, err := exec.LookPath(name)
		if err != nil {
			return fmt.Errorf("starting runsc in the sandbox's namespaces: %w", err)
		}
		tools[i] = p
	}
	args := []string{tools[0], "--net=" + netnsPath, "--", tools[1], "--mount", "--propagation", "slave", "--",
		tools[2], "-c", nsScript, "sh", visible, cmd.Path}
	cmd.Args = append(args, cmd.Args[1:]...)
	cmd.Path = tools[0]
	return nil
}

// netConfig is what runsc takes away from a namespace's interfaces.
type netConfig struct {
	Links []linkConfig `json:"links"`
}

type linkConfig struct {
	Name   string        `json:"name"`
	Addrs  []string      `json:"addrs"` // CIDR, IPv4
	Routes []routeConfig `json:"routes,omitempty"`
}

type routeConfig struct {
	Dst string `json:"dst,omitempty"` // CIDR; "" is the default route
	Gw  string `json:"gw,omitempty"`
}

// restoreAddrs records the IPv4 addresses and routes of every interface
// of the namespace at netnsPath that is up (except loopback) in path, and
// gives those runsc stripped in an earlier run their recorded ones back.
// It returns how many interfaces have addresses now: none means the
// namespace has loopback only. The namespace is the daemon's: the sandbox
// never had a say in it.
func restoreAddrs(netnsPath, path string) (int, error) {
	ns, err := netns.GetFromPath(netnsPath)
	if err != nil {
		return 0, fmt.Errorf("opening network namespace: %w", err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return 0, fmt.Errorf("opening netlink in the sandbox namespace: %w", err)
	}
	defer h.Close()
	var saved netConfig
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return 0, fmt.Errorf("reading network configuration: %w", err)
	default:
		if err := json.Unmarshal(b, &saved); err != nil {
			return 0, fmt.Errorf("parsing network configuration: %w", err)
		}
	}
	links, err := h.LinkList()
	if err != nil {
		return 0, fmt.Errorf("listing links: %w", err)
	}
	var now netConfig
	for _, l := range links {
		a := l.Attrs()
		if a.Flags&net.FlagUp == 0 || a.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, err := h.AddrList(l, netlink.FAMILY_V4)
		if err != nil {
			return 0, fmt.Errorf("listing addresses of %s: %w", a.Name, err)
		}
		if len(addrs) == 0 {
			i := slices.IndexFunc(saved.Links, func(c linkConfig) bool { return c.Name == a.Name })
			if i < 0 {
				continue
			}
			if err := applyLink(h, l, saved.Links[i]); err != nil {
				return 0, err
			}
			now.Links = append(now.Links, saved.Links[i])
			continue
		}
		c := linkConfig{Name: a.Name}
		for _, ad := range addrs {
			c.Addrs = append(c.Addrs, ad.IPNet.String())
		}
		routes, err := h.RouteList(l, netlink.FAMILY_V4)
		if err != nil {
			return 0, fmt.Errorf("listing routes of %s: %w", a.Name, err)
		}
		for _, r := range routes {
			// The kernel makes the prefix routes again with the addresses.
			if r.Protocol == unix.RTPROT_KERNEL {
				continue
			}
			rc := routeConfig{}
			if r.Dst != nil && !(r.Dst.IP.IsUnspecified() && isZeroMask(r.Dst.Mask)) {
				rc.Dst = r.Dst.String()
			}
			if r.Gw != nil {
				rc.Gw = r.Gw.String()
			}
			c.Routes = append(c.Routes, rc)
		}
		now.Links = append(now.Links, c)
	}
	if len(now.Links) == 0 && len(saved.Links) == 0 {
		return 0, nil
	}
	b, err = json.Marshal(now)
	if err != nil {
		return 0, err
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return 0, fmt.Errorf("saving network configuration: %w", err)
	}
	return len(now.Links), nil
}

func isZeroMask(m net.IPMask) bool {
	ones, _ := m.Size()
	return ones == 0
}

// applyLink gives link l the addresses and routes of c.
func applyLink(h *netlink.Handle, l netlink.Link, c linkConfig) error {
	for _, s := range c.Addrs {
		a, err := netlink.ParseAddr(s)
		if err != nil {
			return fmt.Errorf("network configuration: %w", err)
		}
		if err := h.AddrAdd(l, a); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("restoring address of %s: %w", c.Name, err)
		}
	}
	for _, rc := range c.Routes {
		r := &netlink.Route{LinkIndex: l.Attrs().Index}
		if rc.Dst != "" {
			_, dst, err := net.ParseCIDR(rc.Dst)
			if err != nil {
				return fmt.Errorf("network configuration: %w", err)
			}
			r.Dst = dst
		}
		if rc.Gw != "" {
			r.Gw = net.ParseIP(rc.Gw)
		}
		if err := h.RouteReplace(r); err != nil {
			return fmt.Errorf("restoring route of %s: %w", c.Name, err)
		}
	}
	return nil
}
