package drivertest

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
)

func newClient(conn net.Conn) (*agentclient.Client, error) { return agentclient.New(conn) }

// runWait runs req to its end, discarding output.
func runWait(ctx context.Context, c *agentclient.Client, req agentproto.ExecRequest) (agentproto.ExecResult, error) {
	st, err := c.Exec(ctx, req)
	if err != nil {
		return agentproto.ExecResult{}, err
	}
	defer st.Close()
	for {
		ev, err := st.Next()
		if errors.Is(err, io.EOF) {
			return agentproto.ExecResult{}, errors.New("stream ended without exit")
		}
		if err != nil {
			return agentproto.ExecResult{}, err
		}
		if ev.Type == agentproto.EventExit && ev.Result != nil {
			return *ev.Result, nil
		}
	}
}

// pidnsProcsErr lists the live host processes in the pid namespace of pid,
// nil if it cannot be read.
func pidnsProcsErr(pid int) []hostProc {
	ns, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/ns/pid")
	if err != nil {
		return nil
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var procs []hostProc
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if l, err := os.Readlink("/proc/" + e.Name() + "/ns/pid"); err != nil || l != ns {
			continue
		}
		if hp, ok := readHostProc(p); ok {
			procs = append(procs, hp)
		}
	}
	return procs
}

// killPid sends SIGKILL to pid, a process the test started.
func killPid(pid int) error { return unix.Kill(pid, unix.SIGKILL) }
