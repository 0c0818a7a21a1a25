package httpapi_test

import (
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/api"
)

// procState returns the state letter of /proc/pid/stat (R, S, T, Z…).
func procState(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	// The command name is in parentheses and may hold spaces: the state
	// follows the last ')'.
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2 : i+3]
	}
	return ""
}

// severAgentConns shuts down every connection of this process (the daemon
// under test) whose peer is process pid, and returns how many there were.
// SO_PEERCRED of a connection to the agent's socket is the agent (the
// runc driver checks exactly that when it dials), so nothing else is hit.
func severAgentConns(t *testing.T, pid int) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if link, err := os.Readlink("/proc/self/fd/" + e.Name()); err != nil || !strings.HasPrefix(link, "socket:") {
			continue
		}
		cred, err := unix.GetsockoptUcred(fd, unix.SOL_SOCKET, unix.SO_PEERCRED)
		if err != nil || int(cred.Pid) != pid {
			continue
		}
		if err := unix.Shutdown(fd, unix.SHUT_RDWR); err == nil {
			n++
		}
	}
	return n
}

// TestE2ERuncAgentUnavailable is issue #7's agent_unavailable: the agent of
// a sandbox that still runs stops answering and its connection breaks.
// The exec that was running, an exec asked for meanwhile and the sandbox
// itself all say agent_unavailable, never sandbox_crashed: the sandbox's
// init did not die, the platform lost its agent.
func TestE2ERuncAgentUnavailable(t *testing.T) {
	e := newE2E(t)
	h := e.h
	sb := h.create("acme", api.CreateSandboxRequest{})
	running := h.startAsync("acme", sb.ID, api.ExecRequest{Cmd: []string{"sleep", "120"}})
	pid := e.initPid(sb.ID)
	// The agent is the sandbox's init: this test's own sandbox's, found by
	// its host pid and held by a pidfd, so that no signal can reach another
	// process if the pid were reused.
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// If the test failed before the sandbox was destroyed, let its
		// init run again so that the cleanup's delete is a normal one.
		unix.PidfdSendSignal(pidfd, unix.SIGCONT, nil, 0)
		unix.Close(pidfd)
	})
	// Stopped, the agent keeps its sockets but answers nothing, so a new
	// connection is accepted by the kernel and then never greeted: a hung
	// agent, while the sandbox (its init) is alive for the runtime.
	if err := unix.PidfdSendSignal(pidfd, unix.SIGSTOP, nil, 0); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the agent to stop", func() bool { return procState(pid) == "T" })
	if n := severAgentConns(t, pid); n == 0 {
		t.Fatal("found no connection of the daemon to the agent")
	}

	// An exec asked for now cannot start.
	{
		r := h.req("POST", "/v1/sandboxes/"+sb.ID+"/exec", h.key("acme"), api.ExecRequest{Cmd: []string{"true"}})
		h.expect(r, http.StatusServiceUnavailable, api.CodeAgentUnavailable)
		// Its record says the same.
		var list api.ExecList
		h.req("GET", "/v1/sandboxes/"+sb.ID+"/execs", h.key("acme"), nil).json(t, &list)
		found := false
		for _, x := range list.Execs {
			if x.ID != running && len(x.Cmd) == 1 && x.Cmd[0] == "true" {
				found = true
				if x.Status != api.ExecError || x.ErrorCode != api.ExecCodeAgentUnavailable {
					t.Fatalf("record of the exec that could not start: %+v", x)
				}
			}
		}
		if !found {
			t.Fatalf("no record of the exec that could not start: %+v", list.Execs)
		}
	}
	// The exec that was running when the agent went away ends.
	{
		res := h.waitExec("acme", sb.ID, running)
		if res.Status != api.ExecError || res.ErrorCode != api.ExecCodeAgentUnavailable || res.ExitCode != nil {
			t.Fatalf("exec that was running: %+v", res)
		}
	}
	// The sandbox.
	{
		// The daemon gives the agent a few redials, then gives the sandbox
		// up: state error with agent_unavailable, and it is destroyed.
		deadline := time.Now().Add(2 * time.Minute)
		var got api.Sandbox
		for {
			got = h.state("acme", sb.ID)
			if got.State != api.StateRunning || time.Now().After(deadline) {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if got.State != api.StateError || got.Error == nil || got.Error.Code != api.SandboxCodeAgentUnavailable {
			t.Fatalf("sandbox whose agent is gone: %+v (error %+v)", got, got.Error)
		}
		eventually(t, "the sandbox's init to be gone", func() bool {
			s := procState(pid)
			return s == "" || unix.PidfdSendSignal(pidfd, 0, nil, 0) != nil
		})
		// Later requests see a stopped sandbox, not a platform fault.
		h.expect(h.req("POST", "/v1/sandboxes/"+sb.ID+"/exec", h.key("acme"), api.ExecRequest{Cmd: []string{"true"}}), http.StatusConflict, api.CodeInvalidState)
	}
}
