package cli

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/airlockhq/airlock/api"
)

// TestPoolCommands drives `airlock pool` against a pools server: what each
// command sends, and its output as a table and as -o json.
func TestPoolCommands(t *testing.T) {
	var (
		mu    sync.Mutex
		pools = map[string]api.Pool{}
		puts  []api.PutPoolRequest
		seen  []string
	)
	mux := http.NewServeMux()
	mux.HandleFunc("PUT /v1/pools/{name}", func(w http.ResponseWriter, r *http.Request) {
		var req api.PutPoolRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		puts = append(puts, req)
		seen = append(seen, "PUT "+r.URL.RequestURI())
		p := api.Pool{Name: r.PathValue("name"), Tenant: "acme", Template: req.Template, Runtime: "runc", Size: req.Size,
			Status: api.PoolStatus{Ready: 1}}
		if req.Resources != nil {
			p.Resources = *req.Resources
		}
		pools[p.Name] = p
		json.NewEncoder(w).Encode(p)
	})
	mux.HandleFunc("GET /v1/pools", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, "GET "+r.URL.RequestURI())
		l := api.PoolList{Pools: []api.Pool{}}
		for _, p := range pools {
			l.Pools = append(l.Pools, p)
		}
		json.NewEncoder(w).Encode(l)
	})
	mux.HandleFunc("GET /v1/pools/{name}", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		p, ok := pools[r.PathValue("name")]
		if !ok {
			w.WriteHeader(404)
			json.NewEncoder(w).Encode(api.ErrorBody{Error: api.ErrorDetail{Code: api.CodeNotFound, Message: "pool not found"}})
			return
		}
		json.NewEncoder(w).Encode(p)
	})
	mux.HandleFunc("DELETE /v1/pools/{name}", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, "DELETE "+r.URL.RequestURI())
		delete(pools, r.PathValue("name"))
		w.WriteHeader(204)
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	run := func(args ...string) *cliRun { return (&cliRun{sys: fakeSys{}}).run(t, srv.URL, args...) }

	r := run("-o", "json", "pool", "put", "warm", "--template", "base@2", "--size", "3", "--memory-mb", "256", "--tenant", "acme")
	var p api.Pool
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &p) != nil || p.Name != "warm" || p.Size != 3 || p.Resources.MemoryMB != 256 {
		t.Fatalf("put: %d %q %q", r.code, r.stdout, r.stderr)
	}
	if len(puts) != 1 || puts[0].Template != "base@2" || puts[0].Resources == nil || puts[0].Resources.MemoryMB != 256 || seen[0] != "PUT /v1/pools/warm?tenant=acme" {
		t.Fatalf("sent %+v to %v", puts, seen)
	}
	if r := run("pool", "put", "warm"); r.code == 0 || !strings.Contains(r.stderr, "--template") {
		t.Fatalf("put without a template: %d %q", r.code, r.stderr)
	}
	r = run("-o", "json", "pool", "list")
	var l api.PoolList
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &l) != nil || len(l.Pools) != 1 {
		t.Fatalf("list: %d %q %q", r.code, r.stdout, r.stderr)
	}
	if r = run("pool", "ls"); r.code != 0 || !strings.Contains(r.stdout, "READY") || !strings.Contains(r.stdout, "base@2") {
		t.Fatalf("list table: %q", r.stdout)
	}
	if r = run("pool", "get", "warm"); r.code != 0 || !strings.Contains(r.stdout, "memory_mb=256") {
		t.Fatalf("get: %q %q", r.stdout, r.stderr)
	}
	r = run("-o", "json", "pool", "delete", "warm")
	if r.code != 0 || !strings.Contains(r.stdout, `"deleted": true`) {
		t.Fatalf("delete: %d %q %q", r.code, r.stdout, r.stderr)
	}
	if r = run("-o", "json", "pool", "get", "warm"); r.code == 0 || !strings.Contains(r.stderr, `"not_found"`) || r.stdout != "" {
		t.Fatalf("get of a deleted pool: %d %q %q", r.code, r.stdout, r.stderr)
	}
}
