package e2b_test

import (
	"context"
	"strings"
	"testing"

	"connectrpc.com/connect"

	pb "github.com/airlockhq/airlock/internal/plane/e2b/envd/processpb"
)

// TestProcessStartFailures: a command that cannot start ends with its
// reason and the code a shell gives it (127), not as a killed process; a
// cwd that does not exist is the request's error (invalid_argument).
func TestProcessStartFailures(t *testing.T) {
	h := newHarness(t)
	c := h.create("acme")
	pc := h.process(c, codecs[0].opts)
	stream, err := pc.Start(context.Background(), connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "nosuchcmd"}}))
	if err != nil {
		t.Fatal(err)
	}
	r, err := collect(t, stream)
	if err != nil {
		t.Fatal(err)
	}
	if r.end == nil || r.end.GetExitCode() != 127 || r.end.GetExited() || r.end.GetStatus() != "error" ||
		!strings.Contains(r.end.GetError(), "executable file not found") {
		t.Fatalf("end event %v", r.end)
	}
	stream, err = pc.Start(context.Background(), connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "true", Cwd: strPtr("/nonexistent")}}))
	if err == nil {
		_, err = collect(t, stream)
	}
	if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "/nonexistent") {
		t.Fatalf("missing cwd: %v", err)
	}
}
