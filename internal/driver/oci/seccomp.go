package oci

import (
	"fmt"
	"slices"

	"github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// deniedSyscalls fail with EPERM even where Docker's default profile would
// allow them for our capability set. Docker's profile is an allowlist, so most
// of these are already refused; listing them makes the policy explicit and
// keeps it if the upstream profile grows. Why each:
var deniedSyscalls = []string{
	// Kernel keyrings are not namespaced: keys of other sandboxes and of
	// the host could be found or exhausted.
	"keyctl", "add_key", "request_key",
	// eBPF and perf expose kernel memory and attach points, and have a long
	// record of privilege escalations; user code never needs them.
	"bpf", "perf_event_open",
	// userfaultfd lets an attacker stall the kernel mid-copy, a building
	// block of most recent kernel exploits.
	"userfaultfd",
	// Loading kernels and modules is host administration.
	"kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
	// open_by_handle_at walks the host filesystem by inode handle and
	// escapes mount confinement (the "shocker" exploit).
	"open_by_handle_at",
	// No mounts: the sandbox's filesystem layout is fixed by the driver, and
	// the new mount API would reach the same as mount(2).
	"mount", "umount", "umount2", "pivot_root", "fsopen", "fsconfig", "fsmount", "fspick",
	"move_mount", "open_tree", "mount_setattr",
	// New namespaces (a nested user namespace above all) hand an attacker
	// full capabilities over fresh kernel objects: a large attack surface
	// that code in a sandbox has no need for.
	"unshare", "setns",
	// ptrace and its relatives read and write other processes' memory,
	// including the agent's (it runs as root in the same user namespace).
	"ptrace", "process_vm_readv", "process_vm_writev",
}

// Kernel object events (NETLINK_KOBJECT_UEVENT sockets) are refused with
// EPERM. The sandbox's network namespace is made by the daemon, so it
// belongs to the host's user namespace, and the kernel broadcasts every
// host uevent to every such namespace, to anyone who binds the socket: the
// host's devices, and other sandboxes' loop devices coming and going. Nothing
// in a sandbox needs them (no udev runs there). Docker's profile allows
// AF_NETLINK by an equality rule on the domain; that rule is narrowed to
// the other protocols (routing, for ip(8) and getaddrinfo, keeps working)
// and the uevent one refused explicitly, whatever the profile's default.
const (
	afNetlink     = unix.AF_NETLINK
	netlinkUevent = unix.NETLINK_KOBJECT_UEVENT
)

// seccompProfile returns Docker's default profile for spec's capabilities
// with deniedSyscalls removed from every other rule and refused with EPERM,
// and uevent netlink sockets refused with EPERM.
func seccompProfile(spec *specs.Spec) (*specs.LinuxSeccomp, error) {
	p, err := seccomp.GetDefaultProfile(spec)
	if err != nil {
		return nil, fmt.Errorf("building seccomp profile: %w", err)
	}
	// libseccomp rejects two rules with different actions for one syscall,
	// so a deny must replace the allow, not sit beside it.
	rules := p.Syscalls[:0]
	for _, r := range p.Syscalls {
		r.Names = slices.DeleteFunc(slices.Clone(r.Names), func(n string) bool {
			return slices.Contains(deniedSyscalls, n)
		})
		if len(r.Names) > 0 {
			rules = append(rules, r)
		}
	}
	// Only the native architecture: Docker also admits the 32-bit ABIs
	// (x86, x32), which user code here does not need, whose compat syscall
	// paths are a classic source of kernel bugs, and which triple the
	// filter runc compiles at every start (≈ 20 ms of a sandbox's start).
	if len(p.Architectures) > 1 {
		p.Architectures = p.Architectures[:1]
	}
	eperm := uint(unix.EPERM)
	narrowed := false
	for i, r := range rules {
		if isNetlinkSocketRule(r) {
			r.Args = append(slices.Clone(r.Args), specs.LinuxSeccompArg{Index: 2, Value: netlinkUevent, Op: specs.OpNotEqual})
			rules[i] = r
			narrowed = true
		}
	}
	if !narrowed {
		// The upstream profile changed shape: refuse to guess what it
		// allows.
		return nil, fmt.Errorf("building seccomp profile: no AF_NETLINK socket rule to narrow")
	}
	p.Syscalls = append(rules, specs.LinuxSyscall{
		Names:    slices.Clone(deniedSyscalls),
		Action:   specs.ActErrno,
		ErrnoRet: &eperm,
	}, specs.LinuxSyscall{
		Names:  []string{"socket"},
		Action: specs.ActErrno, ErrnoRet: &eperm,
		Args: []specs.LinuxSeccompArg{
			{Index: 0, Value: afNetlink, Op: specs.OpEqualTo},
			{Index: 2, Value: netlinkUevent, Op: specs.OpEqualTo},
		},
	})
	return p, nil
}

// isNetlinkSocketRule reports whether r is the profile's rule that allows
// socket(AF_NETLINK, ...) whatever the protocol.
func isNetlinkSocketRule(r specs.LinuxSyscall) bool {
	if r.Action != specs.ActAllow || !slices.Equal(r.Names, []string{"socket"}) {
		return false
	}
	domain := false
	for _, a := range r.Args {
		switch {
		case a.Index == 0 && a.Op == specs.OpEqualTo && a.Value == afNetlink:
			domain = true
		case a.Index == 2:
			return false // already about the protocol
		}
	}
	return domain
}
