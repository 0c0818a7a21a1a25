package agent_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/errdefs"
)

func TestCloseKillsExecs(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	s, err := e.c.Exec(ctx, agentproto.ExecRequest{ID: "ex_close", Shell: stubbornTree})
	if err != nil {
		t.Fatal(err)
	}
	pids := readPids(t, s, 3)
	done := make(chan error, 1)
	go func() { done <- e.srv.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Close hung")
	}
	waitGone(t, pids)
	if _, err := e.c.ListExecs(ctx); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("after Close: %v", err)
	}
}

// Execs start while other goroutines list, attach and signal: nobody may
// see a half-started exec (run with -race).
func TestConcurrentStartAndInspect(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		c := e.connect()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := c.ListExecs(ctx); err != nil {
				t.Error(err)
				return
			}
			id := fmt.Sprintf("ex_cc_%d", i%20)
			if err := c.Signal(ctx, id, "CONT"); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
				t.Error(err)
				return
			}
		}
	}()
	for i := range 20 {
		got := e.run(agentproto.ExecRequest{ID: fmt.Sprintf("ex_cc_%d", i), Argv: []string{"echo", "x"}})
		if got.result.Status != agentproto.StatusExited || got.stdout.String() != "x\n" {
			t.Errorf("exec %d: %+v", i, got.result)
		}
	}
	close(stop)
	wg.Wait()
}

func TestFinishedExecRetention(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	// More than the table keeps: the oldest finished ones go.
	const n = 300
	for i := range n {
		e.run(agentproto.ExecRequest{ID: fmt.Sprintf("ex_keep_%d", i), Argv: []string{"true"}})
	}
	list, err := e.c.ListExecs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 256 || list[len(list)-1].ID != fmt.Sprintf("ex_keep_%d", n-1) {
		t.Fatalf("kept %d, last %s", len(list), list[len(list)-1].ID)
	}
	if _, err := e.c.Wait(ctx, "ex_keep_0"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("oldest exec: %v", err)
	}
	if _, err := e.c.Wait(ctx, fmt.Sprintf("ex_keep_%d", n-1)); err != nil {
		t.Fatalf("newest exec: %v", err)
	}
}
