package build

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/airlockhq/airlock/api"
)

// hookCall is one use of the Network hook.
type hookCall struct {
	id      string
	owner   Owner
	ok      bool
	cleaned bool
	// existedAtCleanup: the sandbox's directory still existed when its
	// network was removed (it must be destroyed first).
	existedAtCleanup bool
}

// TestNetworkHookForRunOnly: RUN sandboxes (and only they) get the Network
// hook's network, its context names the build's tenant and template, and
// each network is removed after its sandbox was destroyed.
func TestNetworkHookForRunOnly(t *testing.T) {
	var (
		mu    sync.Mutex
		calls []*hookCall
	)
	var sandboxes string
	e := newEnv(t, func(c *Config) {
		c.Network = func(ctx context.Context, id string) (Network, func(), error) {
			o, ok := OwnerOf(ctx)
			hc := &hookCall{id: id, owner: o, ok: ok}
			mu.Lock()
			calls = append(calls, hc)
			mu.Unlock()
			// No namespace: the sandbox gets its runtime's loopback-only
			// one; the hook's wiring is what is tested here (the daemon's
			// tests run the real registry network).
			return Network{}, func() {
				_, err := os.Stat(filepath.Join(sandboxes, id))
				mu.Lock()
				hc.cleaned, hc.existedAtCleanup = true, err == nil
				mu.Unlock()
			}, nil
		}
	})
	sandboxes = filepath.Join(e.dataDir, "sandboxes")
	spec := "FROM base\nCOPY hello.txt /srv/\nRUN cat /srv/hello.txt > /srv/copy.txt\nRUN echo two > /srv/two.txt\n"
	st, res := e.build(t, Request{Tenant: "t9", Name: "hooked", Spec: spec, ContextPath: contextTar(t, map[string]string{"hello.txt": "hi\n"})})
	if res.Status != api.BuildReady {
		t.Fatalf("build: %s %s\n%s", res.Status, res.Error, res.Log)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(calls) != 2 {
		t.Fatalf("the hook ran %d times, want once per RUN (2)", len(calls))
	}
	var ids []string
	for _, c := range calls {
		if !c.ok || c.owner != (Owner{Tenant: "t9", Template: "hooked", BuildID: st.BuildID}) {
			t.Errorf("hook context owner %+v (found %v)", c.owner, c.ok)
		}
		if !strings.HasPrefix(c.id, BuildSandboxPrefix) || slices.Contains(ids, c.id) {
			t.Errorf("hook sandbox id %q", c.id)
		}
		ids = append(ids, c.id)
		if !c.cleaned || c.existedAtCleanup {
			t.Errorf("network of %s: cleaned %v, sandbox still there %v", c.id, c.cleaned, c.existedAtCleanup)
		}
	}
}

func TestAvailableRegistries(t *testing.T) {
	got := AvailableRegistries(map[string][]string{"pypi": {"pypi.org"}, "npm": nil, "debian": {"deb.example"}, "other": {"x"}})
	if !slices.Equal(got, []string{"debian", "pypi"}) {
		t.Fatalf("got %v", got)
	}
}
