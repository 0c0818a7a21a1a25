package cli

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlockhq/airlock/internal/hostslot"
)

// sysProbe is doctor's view of the host, so tests can play other hosts.
type sysProbe interface {
	Geteuid() int
	LookPath(name string) (string, error)
	// Output runs a program briefly and returns its stdout.
	Output(name string, args ...string) (string, error)
	ReadFile(path string) ([]byte, error)
	Stat(path string) (fs.FileInfo, error)
	// OpenRW opens a device read-write and closes it again.
	OpenRW(path string) error
	Executable() (string, error)
	// HostSlots lists the host slots daemons have claimed.
	HostSlots() ([]hostslot.Slot, error)
}

// hostProbe is the real host.
type hostProbe struct{}

func (hostProbe) Geteuid() int                         { return os.Geteuid() }
func (hostProbe) LookPath(name string) (string, error) { return exec.LookPath(name) }
func (hostProbe) ReadFile(path string) ([]byte, error) { return os.ReadFile(path) }
func (hostProbe) Stat(path string) (fs.FileInfo, error) {
	return os.Stat(path)
}
func (hostProbe) Executable() (string, error) { return os.Executable() }

func (hostProbe) HostSlots() ([]hostslot.Slot, error) { return hostslot.List("") }

func (hostProbe) OpenRW(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	return f.Close()
}

func (hostProbe) Output(name string, args ...string) (string, error) {
	// A version query answers in milliseconds; the bound only guards
	// against a wedged binary.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).Output()
	return string(out), err
}

// Check outcomes.
const (
	checkOK      = "ok"
	checkMissing = "missing"
	checkInfo    = "info"
)

// check is one line of doctor's report.
type check struct {
	Name     string `json:"name"`
	Status   string `json:"status"`
	Detail   string `json:"detail,omitempty"`
	Fix      string `json:"fix,omitempty"`
	Required bool   `json:"required"`
}

func (a *app) newDoctorCmd() *cobra.Command {
	var noServer bool
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Check that this host can run airlock, and say how to fix what is missing",
		Long: `Check this host for what airlock serve needs: root, runc, cgroup controllers,
user namespaces, the agent binary and debootstrap (required), and what the
optional runtimes and network modes need: runsc (gvisor), qemu and /dev/kvm
(microvm), nft (network allowlists). Each missing item comes with the command
that installs it. Works without a running server; exits 1 when a required
item is missing.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			checks := runChecks(a.sys)
			if !noServer {
				checks = append(checks, a.serverCheck(cmd.Context()))
			}
			failed := 0
			for _, c := range checks {
				if c.Required && c.Status != checkOK {
					failed++
				}
			}
			if a.output == "json" {
				if err := printJSON(a.stdout, checks); err != nil {
					return err
				}
			} else {
				t := newTable(a.stdout, "CHECK", "STATUS", "DETAIL")
				for _, c := range checks {
					status := c.Status
					if c.Status != checkOK && !c.Required {
						status += " (optional)"
					}
					t.row(c.Name, status, c.Detail)
					if c.Fix != "" && c.Status != checkOK {
						t.row("", "", "fix: "+c.Fix)
					}
				}
				if err := t.flush(); err != nil {
					return err
				}
			}
			if failed > 0 {
				return codedError{code: "doctor", msg: fmt.Sprintf("%d required check(s) failed", failed)}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&noServer, "no-server", false, "skip asking the server whether it runs")
	return cmd
}

// serverCheck reports whether a server answers; never a failure, since
// doctor is for hosts that do not run one yet.
func (a *app) serverCheck(ctx context.Context) check {
	c := check{Name: "server", Status: checkInfo}
	cl, err := a.client()
	if err != nil {
		c.Detail = oneLine(err)
		return c
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := cl.Health(ctx); err != nil {
		c.Detail = "not answering at " + cl.BaseURL()
		c.Fix = "start it: sudo airlock serve"
		return c
	}
	c.Status = checkOK
	c.Detail = "answering at " + cl.BaseURL()
	return c
}

// runChecks inspects the host. Order: what serve needs first.
func runChecks(s sysProbe) []check {
	return []check{
		checkRoot(s),
		checkBinary(s, "runc", "runc", true, "--version", "apt-get install runc"),
		checkCgroups(s),
		checkUserNS(s),
		checkKernel(s),
		checkAgent(s),
		checkBinary(s, "debootstrap", "debootstrap", true, "", "apt-get install debootstrap"),
		checkBinary(s, "runsc (gvisor)", "runsc", false, "--version", "apt-get install runsc"),
		checkBinary(s, "qemu (microvm)", "qemu-system-x86_64", false, "--version", "apt-get install qemu-system-x86"),
		checkKVM(s),
		checkBinary(s, "nft (network allowlists)", "nft", false, "--version", "apt-get install nftables"),
		checkSlots(s),
	}
}

// checkSlots says which daemons own host slots: each daemon on a host has
// its own (internal/hostslot), and one that is not held may still have
// sandboxes running under its names.
func checkSlots(s sysProbe) check {
	c := check{Name: "host slots", Status: checkInfo}
	slots, err := s.HostSlots()
	if err != nil {
		c.Detail = oneLine(err)
		return c
	}
	var parts []string
	for _, sl := range slots {
		who := "idle"
		if sl.Held {
			who = "pid " + strconv.Itoa(sl.PID)
		}
		parts = append(parts, fmt.Sprintf("%d: %s (%s, veths %s*)", sl.Slot, sl.DataDir, who, sl.IfPrefix))
	}
	if len(parts) == 0 {
		c.Detail = "none claimed (no daemon has run since boot)"
		return c
	}
	c.Detail = strings.Join(parts, "; ")
	return c
}

func checkRoot(s sysProbe) check {
	c := check{Name: "root", Required: true}
	if s.Geteuid() == 0 {
		c.Status, c.Detail = checkOK, "running as root"
		return c
	}
	c.Status = checkMissing
	c.Detail = fmt.Sprintf("running as uid %d; airlock serve needs root for namespaces, mounts and cgroups", s.Geteuid())
	c.Fix = "run the server as root: sudo airlock serve"
	return c
}

// checkBinary looks for a program and, with versionFlag, reports its version.
func checkBinary(s sysProbe, name, bin string, required bool, versionFlag, fix string) check {
	c := check{Name: name, Required: required, Fix: fix}
	p, err := s.LookPath(bin)
	if err != nil {
		c.Status, c.Detail = checkMissing, bin+" not found on PATH"
		return c
	}
	c.Status, c.Detail = checkOK, p
	if versionFlag != "" {
		out, err := s.Output(p, versionFlag)
		if err != nil {
			c.Status = checkMissing
			c.Detail = fmt.Sprintf("%s %s failed: %v", p, versionFlag, err)
			return c
		}
		if line, _, _ := strings.Cut(strings.TrimSpace(out), "\n"); line != "" {
			c.Detail = p + ": " + strings.TrimSpace(line)
		}
	}
	return c
}

// cgroupControllers airlock limits and freezes sandboxes with.
var cgroupControllers = []string{"memory", "pids", "cpu", "freezer"}

func checkCgroups(s sysProbe) check {
	c := check{Name: "cgroups", Required: true}
	if b, err := s.ReadFile("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		// Unified (v2) hierarchy; freezing is built in (cgroup.freeze).
		have := map[string]bool{"freezer": true}
		for _, f := range strings.Fields(string(b)) {
			have[f] = true
		}
		return cgroupResult(c, "v2", have, "enable them for child groups: echo '+memory +pids +cpu' > /sys/fs/cgroup/cgroup.subtree_control")
	}
	b, err := s.ReadFile("/proc/cgroups")
	if err != nil {
		c.Status, c.Detail = checkMissing, "no cgroup filesystem found"
		c.Fix = "mount cgroups (systemd does at boot): mount -t cgroup2 none /sys/fs/cgroup"
		return c
	}
	have := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		// subsys_name hierarchy num_cgroups enabled
		f := strings.Fields(sc.Text())
		if len(f) != 4 || strings.HasPrefix(f[0], "#") {
			continue
		}
		if f[1] != "0" && f[3] == "1" {
			have[f[0]] = true
		}
	}
	mode := "v1"
	if _, err := s.Stat("/sys/fs/cgroup/unified"); err == nil {
		mode = "v1 (hybrid)"
	}
	return cgroupResult(c, mode, have, "enable them on the kernel command line (e.g. cgroup_enable=memory) and mount them under /sys/fs/cgroup")
}

func cgroupResult(c check, mode string, have map[string]bool, fix string) check {
	var missing []string
	for _, ctl := range cgroupControllers {
		if !have[ctl] {
			missing = append(missing, ctl)
		}
	}
	if len(missing) > 0 {
		c.Status = checkMissing
		c.Detail = mode + ": missing controllers " + strings.Join(missing, " ")
		c.Fix = fix
		return c
	}
	c.Status = checkOK
	c.Detail = mode + ": " + strings.Join(cgroupControllers, " ")
	return c
}

func checkUserNS(s sysProbe) check {
	c := check{Name: "user namespaces", Required: true, Fix: "sysctl -w user.max_user_namespaces=15000"}
	b, err := s.ReadFile("/proc/sys/user/max_user_namespaces")
	if err != nil {
		c.Status, c.Detail = checkMissing, "kernel without user namespaces"
		c.Fix = "use a kernel built with CONFIG_USER_NS (Debian's is)"
		return c
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n <= 0 {
		c.Status, c.Detail = checkMissing, "user.max_user_namespaces is "+strings.TrimSpace(string(b))
		return c
	}
	c.Status, c.Detail = checkOK, fmt.Sprintf("max %d", n)
	return c
}

// checkKernel wants idmapped layers under overlayfs (Linux 5.19), which give
// every sandbox its own uid range over one shared template.
func checkKernel(s sysProbe) check {
	c := check{Name: "kernel", Required: true, Fix: "upgrade to Linux 5.19 or newer (Debian bookworm ships 6.1)"}
	b, err := s.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		c.Status, c.Detail = checkMissing, "cannot read the kernel release"
		return c
	}
	rel := strings.TrimSpace(string(b))
	var major, minor int
	if _, err := fmt.Sscanf(rel, "%d.%d", &major, &minor); err != nil {
		c.Status, c.Detail = checkMissing, "unrecognised kernel release "+rel
		return c
	}
	if major < 5 || (major == 5 && minor < 19) {
		c.Status, c.Detail = checkMissing, rel+": idmapped overlay layers need 5.19"
		return c
	}
	c.Status, c.Detail = checkOK, rel
	return c
}

// checkAgent finds airlock-agent the way the server does: beside the
// running executable, then on PATH.
func checkAgent(s sysProbe) check {
	c := check{Name: "airlock-agent", Required: true,
		Fix: "build it beside airlock (make build puts bin/airlock-agent next to bin/airlock), or pass --agent-path to serve"}
	if exe, err := s.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), "airlock-agent")
		if fi, err := s.Stat(p); err == nil && fi.Mode().IsRegular() {
			c.Status, c.Detail = checkOK, p
			return c
		}
	}
	if p, err := s.LookPath("airlock-agent"); err == nil {
		c.Status, c.Detail = checkOK, p
		return c
	}
	c.Status, c.Detail = checkMissing, "not beside this executable nor on PATH"
	return c
}

func checkKVM(s sysProbe) check {
	c := check{Name: "/dev/kvm (microvm)",
		Fix: "enable virtualisation and load the module (modprobe kvm_intel or kvm_amd); without it microvm runs emulated (TCG), much slower"}
	err := s.OpenRW("/dev/kvm")
	switch {
	case err == nil:
		c.Status, c.Detail = checkOK, "usable"
	case errors.Is(err, fs.ErrNotExist):
		c.Status, c.Detail = checkMissing, "no /dev/kvm"
	default:
		c.Status, c.Detail = checkMissing, "cannot open /dev/kvm: "+err.Error()
	}
	return c
}
