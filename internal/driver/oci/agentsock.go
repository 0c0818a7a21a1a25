package oci

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/airlockhq/airlock/internal/cgroups"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// AgentSocket is how the daemon reaches a sandbox's agent: a unix socket on
// the host, in a directory of the sandbox's, whose peer DialAgent checks
// before it hands out a connection. InheritedSocket and SharedDirSocket
// are the two ways; a driver names its one in Config.Socket.
type AgentSocket interface {
	// prepare makes what the socket needs in the dir of a new sandbox
	// whose root is host uid (after its storage: the storage teardown
	// unmounts what is mounted here).
	prepare(dir string, uid uint32) error
	// bundle returns the agent's command line and the mounts the bundle
	// needs for the socket.
	bundle(dir string) (args []string, mounts []specs.Mount)
	// start readies the socket before init runs and returns the files
	// init inherits (descriptors 3, 4…), which the caller closes.
	start(dir string, uid uint32) ([]*os.File, error)
	// dial connects once to the agent of the sandbox st, whose init runs
	// as initPid (0 if unknown) in cgroup g. It returns errNotListening
	// while nobody listens.
	dial(ctx context.Context, st *State, initPid int, g *cgroups.Group) (net.Conn, error)
}

// InheritedSocket is the daemon's own socket, inherited by init (runc). The
// daemon makes the agent's unix socket itself, at <sandbox>/run/agent.sock:
// run/ is root's, mode 0700, and never mounted into the sandbox, so nothing
// inside can reach, replace or symlink the socket file. Start hands the
// bound socket to the sandbox's init (runc --preserve-fds, descriptor
// agentFD), the agent listens on it and keeps it for its whole life, so a
// restarted daemon reconnects to the same path. DialAgent then checks that
// whoever answers is the sandbox's agent: the kernel reports the
// credentials of the process that called listen(2) (SO_PEERCRED), which
// must be the sandbox's init, root of its user namespace.
type InheritedSocket struct{}

// runDirName is InheritedSocket's directory in a sandbox dir.
const runDirName = "run"

func (InheritedSocket) prepare(dir string, _ uint32) error {
	// Root's, and it stays on the host: the umask cannot widen 0700.
	if err := os.Mkdir(filepath.Join(dir, runDirName), 0o700); err != nil {
		return fmt.Errorf("creating agent run dir: %w", err)
	}
	return nil
}

func (InheritedSocket) bundle(string) ([]string, []specs.Mount) {
	return []string{agentMountPath, "--fd", strconv.Itoa(agentFD)}, nil
}

func (InheritedSocket) start(dir string, _ uint32) ([]*os.File, error) {
	// A fresh socket for every start: the one of an earlier init died
	// with it.
	sock, err := bindAgentSocket(filepath.Join(dir, runDirName))
	if err != nil {
		return nil, err
	}
	return []*os.File{sock}, nil
}

func (InheritedSocket) dial(ctx context.Context, st *State, initPid int, _ *cgroups.Group) (net.Conn, error) {
	return dialAgentSocket(ctx, filepath.Join(st.Dir, runDirName), peer{uid: st.UIDBase, pid: initPid})
}

// agentSockName is the agent's socket in the sandbox's socket dir.
const agentSockName = "agent.sock"

// errNotListening means the agent has not listened on its socket yet (or
// its init is gone): DialAgent retries.
var errNotListening = errors.New("agent not listening")

// bindAgentSocket makes a unix stream socket bound at dir/agent.sock,
// replacing a stale one of an earlier start. It does not listen: the agent
// does, so that clients see it as the socket's peer, and until then a
// connection is refused, which DialAgent takes for "not ready yet".
func bindAgentSocket(dir string) (*os.File, error) {
	dfd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening agent run dir: %w", err)
	}
	defer unix.Close(dfd)
	if err := unix.Unlinkat(dfd, agentSockName, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return nil, fmt.Errorf("removing stale agent socket: %w", err)
	}
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("agent socket: %w", err)
	}
	// Through the directory's descriptor: a sockaddr holds 107 bytes of
	// path at most, and a data dir path can be longer.
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: fmt.Sprintf("/proc/self/fd/%d/%s", dfd, agentSockName)}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("binding agent socket: %w", err)
	}
	if err := unix.Fchmodat(dfd, agentSockName, 0o600, 0); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("agent socket mode: %w", err)
	}
	return os.NewFile(uintptr(fd), "agent-socket"), nil
}

// peer is who must answer on a sandbox's agent socket.
type peer struct {
	uid uint32 // host uid of the sandbox's root (its uid base); gid likewise
	pid int    // host pid of its init, 0 if unknown
	// cgroup, if set, must hold the peer's pid: with SharedDirSocket the
	// host side of the socket belongs to the runtime's file proxy (runsc's
	// gofer), a process of the sandbox but not its init.
	cgroup *cgroups.Group
}

// dialAgentSocket connects to dir/agent.sock and checks the peer. The file
// is opened without following a symlink and must be a socket owned by host
// root (the daemon made it) or by the sandbox's root (a sandbox started by
// a daemon before this layout, whose agent made it); the connection goes
// to that very inode. It returns errNotListening while nobody listens, and
// an error wrapping errdefs.ErrUnavailable if someone else answers.
func dialAgentSocket(ctx context.Context, dir string, want peer) (net.Conn, error) {
	dfd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening agent run dir: %w", err)
	}
	defer unix.Close(dfd)
	sfd, err := unix.Openat(dfd, agentSockName, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil, errNotListening
	}
	if err != nil {
		return nil, fmt.Errorf("opening agent socket: %w", err)
	}
	defer unix.Close(sfd)
	var st unix.Stat_t
	if err := unix.Fstat(sfd, &st); err != nil {
		return nil, fmt.Errorf("agent socket: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK || (st.Uid != 0 && st.Uid != want.uid) {
		return nil, errdefs.Wrap(errdefs.ErrUnavailable, "agent socket is not a socket of the daemon or the sandbox (mode %o, owner %d)", st.Mode, st.Uid)
	}
	var dialer net.Dialer
	conn, err := dialer.DialContext(ctx, "unix", fmt.Sprintf("/proc/self/fd/%d", sfd))
	if err != nil {
		if errors.Is(err, unix.ECONNREFUSED) {
			return nil, errNotListening
		}
		return nil, err
	}
	if err := checkPeer(conn, want); err != nil {
		conn.Close()
		return nil, err
	}
	return conn, nil
}

// checkPeer fails unless conn's peer is want: the process that listens on
// the agent socket runs as the sandbox's root and, if known, is its init.
func checkPeer(conn net.Conn, want peer) error {
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		return fmt.Errorf("agent connection is a %T", conn)
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return err
	}
	if credErr != nil {
		return fmt.Errorf("agent peer credentials: %w", credErr)
	}
	if cred.Uid != want.uid || cred.Gid != want.uid || (want.pid > 0 && int(cred.Pid) != want.pid) {
		return errdefs.Wrap(errdefs.ErrUnavailable, "agent socket answered by pid %d uid %d gid %d, want the sandbox's init (pid %d, uid %d)",
			cred.Pid, cred.Uid, cred.Gid, want.pid, want.uid)
	}
	if want.cgroup != nil && !inCgroup(want.cgroup, int(cred.Pid)) {
		return errdefs.Wrap(errdefs.ErrUnavailable, "agent socket answered by pid %d, not a process of the sandbox's cgroup %s",
			cred.Pid, want.cgroup.Path())
	}
	return nil
}

// SharedDirSocket is the agent's own socket, in a directory shared with
// the host (runsc). runsc cannot hand init a socket the daemon bound (it
// has no --preserve-fds), so the agent listens itself, at
// socketMountPath/agent.sock inside the sandbox, a bind mount of the host
// directory <sandbox>/uds: runsc (--host-uds) then makes a real host socket
// there, which a restarted daemon reconnects to. The directory is a 16 KiB
// tmpfs (so no way around the disk quota), the sandbox root's (its uid
// base), mode 0700, mounted into no other sandbox, so no other sandbox can
// reach it, and handed to host root once the agent answers
// (sealSocketDir, sealOnReply); a symlink or anything but a socket there is refused
// (dialAgentSocket); DialAgent checks that the peer runs as this
// sandbox's uid base and is a process of its cgroup.
type SharedDirSocket struct{}

// socketDirName is the host directory of the agent's own socket.
const socketDirName = "uds"

func (SharedDirSocket) prepare(dir string, uid uint32) error {
	return makeSocketDir(filepath.Join(dir, socketDirName), uid)
}

func (SharedDirSocket) bundle(dir string) ([]string, []specs.Mount) {
	return []string{agentMountPath, "--listen", "unix:" + socketMountPath + "/" + agentSockName},
		[]specs.Mount{{Destination: socketMountPath, Type: "bind", Source: filepath.Join(dir, socketDirName),
			Options: []string{"bind", "rw", "nosuid", "nodev", "noexec"}}}
}

func (SharedDirSocket) start(dir string, uid uint32) ([]*os.File, error) {
	// The agent makes its own socket; an earlier one died with the
	// earlier init and would only answer "refused".
	sd := filepath.Join(dir, socketDirName)
	if err := sealSocketDir(sd, uid, false); err != nil {
		return nil, err
	}
	return nil, removeStaleSocket(sd)
}

func (SharedDirSocket) dial(ctx context.Context, st *State, _ int, g *cgroups.Group) (net.Conn, error) {
	// The runtime's file proxy, not init, listens on the host side: the
	// peer must be a process of the sandbox's cgroup.
	sd := filepath.Join(st.Dir, socketDirName)
	conn, err := dialAgentSocket(ctx, sd, peer{uid: st.UIDBase, cgroup: g})
	if err != nil {
		return nil, err
	}
	sealed, err := socketDirSealed(sd)
	if err != nil || sealed {
		if err != nil {
			conn.Close()
		}
		return conn, err
	}
	// The proxy accepts on the host as soon as the agent has bound its
	// socket, before the agent is done with it (it still sets the
	// socket's mode, which fails in a sealed dir and ends the agent): the
	// dir is sealed once the agent answers, which is after that and
	// before anything of the caller's can run in the sandbox.
	return sealOnReply(conn.(*net.UnixConn), func() error { return sealSocketDir(sd, st.UIDBase, true) }), nil
}

// socketDirSealed reports whether dir is sealed (host root's, 0755).
func socketDirSealed(dir string) (bool, error) {
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return false, fmt.Errorf("agent socket dir: %w", err)
	}
	return st.Uid == 0 && st.Mode&0o777 == 0o755, nil
}

// sealOnReply returns conn, which calls seal once before it hands out the
// first bytes the peer sent; if seal fails, conn is closed and its reads
// fail with seal's error.
func sealOnReply(conn *net.UnixConn, seal func() error) net.Conn {
	return &sealingConn{UnixConn: conn, seal: seal}
}

type sealingConn struct {
	*net.UnixConn
	once sync.Once
	seal func() error
	err  error
}

func (c *sealingConn) Read(p []byte) (int, error) {
	n, err := c.UnixConn.Read(p)
	if n > 0 {
		c.once.Do(func() {
			if c.err = c.seal(); c.err != nil {
				c.UnixConn.Close()
			}
		})
		if c.err != nil {
			return 0, c.err
		}
	}
	return n, err
}

// socketDirSize bounds the socket dir's tmpfs: while the agent starts the
// sandbox can write there, and it must not be a way around the disk quota
// onto the data dir's file system. A socket takes no data.
const socketDirSize = "size=16k,nr_inodes=16"

// sealSocketDir hands the socket dir to host root, mode 0755 (ro true), or
// back to the sandbox's root, uid, mode 0700. Once the agent answers,
// nothing needs to write there, and a dir of host root, a uid the
// sandbox's user namespace does not map, keeps even root inside (the
// runtime's file proxy acts as the sandbox's root) from replacing the
// socket the daemon dials, with a symlink to another sandbox's or its own
// listener, before a daemon restart; connecting needs no write. A read-only
// remount would not do: the runtime's file proxy works in its own mount
// namespace, on a copy of the mount. Start opens it again for the next
// agent.
func sealSocketDir(dir string, uid uint32, ro bool) error {
	owner, mode := int(uid), os.FileMode(0o700)
	if ro {
		owner, mode = 0, 0o755
	}
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return fmt.Errorf("agent socket dir: %w", err)
	}
	if int(st.Uid) == owner && os.FileMode(st.Mode&0o777) == mode {
		return nil
	}
	if err := os.Chown(dir, owner, owner); err != nil {
		return fmt.Errorf("agent socket dir owner: %w", err)
	}
	if err := os.Chmod(dir, mode); err != nil {
		return fmt.Errorf("agent socket dir mode: %w", err)
	}
	return nil
}

// makeSocketDir mounts a tiny tmpfs at dir, owned by the sandbox's root
// (uid), mode 0700. storage.TeardownDir unmounts it with the sandbox's
// other mounts.
func makeSocketDir(dir string, uid uint32) error {
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fmt.Errorf("creating agent socket dir: %w", err)
	}
	opts := fmt.Sprintf("%s,mode=0700,uid=%d,gid=%d", socketDirSize, uid, uid)
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, opts); err != nil {
		return fmt.Errorf("mounting agent socket dir: %w", err)
	}
	return nil
}

// removeStaleSocket removes the socket of an earlier agent in dir.
func removeStaleSocket(dir string) error {
	dfd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening agent socket dir: %w", err)
	}
	defer unix.Close(dfd)
	if err := unix.Unlinkat(dfd, agentSockName, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("removing stale agent socket: %w", err)
	}
	return nil
}

// OpenAgentSocketDir hands the agent's socket dir of sandbox id back to
// the sandbox's root, as Start does, without removing the socket: its
// agent may then remove it (SharedDirSocket only). The next dial that the
// agent answers seals it again.
func (c *Core) OpenAgentSocketDir(id string) error {
	if _, ok := c.cfg.Socket.(SharedDirSocket); !ok {
		return errdefs.Wrap(errdefs.ErrCapabilityUnsupported, "%s: the agent listens on an inherited socket", c.cfg.Name)
	}
	st, err := loadState(c.Dir(id))
	if err != nil {
		return err
	}
	return sealSocketDir(filepath.Join(st.Dir, socketDirName), st.UIDBase, false)
}

// AgentSocketExists reports whether the agent's socket file of sandbox id
// is there (SharedDirSocket: the agent makes and removes it).
func (c *Core) AgentSocketExists(id string) (bool, error) {
	_, err := os.Lstat(filepath.Join(c.Dir(id), socketDirName, agentSockName))
	switch {
	case errors.Is(err, os.ErrNotExist):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("agent socket: %w", err)
	}
	return true, nil
}
