package client

import (
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"net/http"
	"os"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/api"
)

// loadSpec parses api/openapi.yaml, the api module's sibling directory in
// the airlock repository.
func loadSpec(t *testing.T) map[string]any {
	t.Helper()
	b, err := os.ReadFile("../api/openapi.yaml")
	if errors.Is(err, fs.ErrNotExist) {
		if _, rerr := os.Stat("../go.mod"); errors.Is(rerr, fs.ErrNotExist) {
			// A copy of this module alone (the module cache, a vendor
			// directory): the spec checks run in the repository.
			t.Skip("../api/openapi.yaml: not in the airlock repository")
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	v, err := parseYAML(string(b))
	if err != nil {
		t.Fatalf("api/openapi.yaml: %v", err)
	}
	m, ok := v.(map[string]any)
	if !ok {
		t.Fatal("spec is not a mapping")
	}
	return m
}

func getMap(t *testing.T, m map[string]any, path ...string) map[string]any {
	t.Helper()
	cur := m
	for _, k := range path {
		next, ok := cur[k].(map[string]any)
		if !ok {
			t.Fatalf("spec: %s is not a mapping", strings.Join(path, "."))
		}
		cur = next
	}
	return cur
}

var httpMethods = []string{"get", "put", "post", "delete", "patch", "head", "options"}

// opStatus is an operation's x-airlock-status: its own, else its path
// item's.
func opStatus(item, op map[string]any) any {
	if s, ok := op["x-airlock-status"]; ok {
		return s
	}
	return item["x-airlock-status"]
}

// TestSpecStructure checks what a generic validator would not: every path
// says whether it is served (implemented) or the contract of an issue being
// delivered (planned), every issue-#3 route is marked implemented, and
// every $ref resolves.
func TestSpecStructure(t *testing.T) {
	spec := loadSpec(t)
	if spec["openapi"] != "3.1.0" {
		t.Errorf("openapi = %v, want 3.1.0", spec["openapi"])
	}
	paths := getMap(t, spec, "paths")
	implemented, listed := map[string]bool{}, map[string]bool{}
	for p, v := range paths {
		item, ok := v.(map[string]any)
		if !ok {
			t.Errorf("path %s is not a mapping", p)
			continue
		}
		if status := item["x-airlock-status"]; status != "implemented" && status != "planned" {
			t.Errorf("path %s: x-airlock-status = %v, want implemented or planned", p, status)
		}
		for _, m := range httpMethods {
			op, ok := item[m].(map[string]any)
			if !ok {
				continue
			}
			switch status := opStatus(item, op); status {
			case "implemented":
				implemented[strings.ToUpper(m)+" "+p] = true
			case "planned":
			default:
				t.Errorf("%s %s: x-airlock-status = %v, want implemented or planned", m, p, status)
			}
			listed[strings.ToUpper(m)+" "+p] = true
			if op["operationId"] == nil || op["responses"] == nil {
				t.Errorf("%s %s: needs operationId and responses", m, p)
			}
		}
	}
	// Issue #3: sandboxes CRUD, timeout, pause, resume, metrics, exec modes,
	// execs, events, stdin, signal, pty, files, fs/*, keys, service.
	for _, r := range []string{
		"POST /v1/sandboxes", "GET /v1/sandboxes", "GET /v1/sandboxes/{id}", "DELETE /v1/sandboxes/{id}",
		"POST /v1/sandboxes/{id}/timeout", "POST /v1/sandboxes/{id}/pause", "POST /v1/sandboxes/{id}/resume",
		"GET /v1/sandboxes/{id}/metrics", "POST /v1/sandboxes/{id}/exec", "GET /v1/sandboxes/{id}/execs",
		"GET /v1/sandboxes/{id}/execs/{eid}", "GET /v1/sandboxes/{id}/execs/{eid}/events",
		"POST /v1/sandboxes/{id}/execs/{eid}/stdin", "POST /v1/sandboxes/{id}/execs/{eid}/signal",
		"GET /v1/sandboxes/{id}/pty", "PUT /v1/sandboxes/{id}/files", "GET /v1/sandboxes/{id}/files",
		"GET /v1/sandboxes/{id}/fs/list", "GET /v1/sandboxes/{id}/fs/stat", "POST /v1/sandboxes/{id}/fs/mkdir",
		"POST /v1/sandboxes/{id}/fs/move", "DELETE /v1/sandboxes/{id}/fs",
		"POST /v1/keys", "GET /v1/keys", "DELETE /v1/keys/{id}",
		"GET /healthz", "GET /readyz", "GET /metrics", "GET /v1/info",
		// Issue #4: templates.
		"POST /v1/templates", "GET /v1/templates", "GET /v1/templates/builds/{id}",
		"GET /v1/templates/{name}", "DELETE /v1/templates/{name}",
		// Issue #8: the code interpreter.
		"POST /v1/sandboxes/{id}/code", "POST /v1/sandboxes/{id}/contexts", "GET /v1/sandboxes/{id}/contexts",
		"DELETE /v1/sandboxes/{id}/contexts/{cid}", "POST /v1/sandboxes/{id}/contexts/{cid}/restart",
		// Issues #5 and #6: quotas and previews.
		"GET /v1/tenants/{tenant}/quotas", "PUT /v1/tenants/{tenant}/quotas", "DELETE /v1/tenants/{tenant}/quotas",
		"POST /v1/sandboxes/{id}/previews", "GET /v1/sandboxes/{id}/previews", "DELETE /v1/sandboxes/{id}/previews/{port}",
	} {
		if !implemented[r] {
			t.Errorf("%s is not in the spec as implemented", r)
		}
	}
	// Issue #15: durable sandboxes, in the spec as planned until served
	// (the server's route test fails on a served route marked planned).
	for _, r := range []string{
		"POST /v1/sandboxes/{id}/snapshots", "GET /v1/snapshots", "GET /v1/snapshots/{sid}", "DELETE /v1/snapshots/{sid}",
		"POST /v1/sandboxes/{id}/fork", "POST /v1/sandboxes/{id}/reset", "POST /v1/sandboxes/{id}/keepalive",
		"PATCH /v1/sandboxes/{id}", "GET /v1/pools", "PUT /v1/pools/{name}", "GET /v1/pools/{name}", "DELETE /v1/pools/{name}",
	} {
		if !listed[r] {
			t.Errorf("%s is not in the spec", r)
		}
	}
	// An issue that is not being delivered has no paths (a client would
	// read the 404 as "sandbox not found").
	for _, p := range []string{"/v1/volumes"} {
		if _, ok := paths[p]; ok {
			t.Errorf("%s is in the spec but not served", p)
		}
	}

	var refs []string
	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				if k == "$ref" {
					refs = append(refs, e.(string))
					continue
				}
				walk(e)
			}
		case []any:
			for _, e := range x {
				walk(e)
			}
		}
	}
	walk(spec)
	if len(refs) < 100 {
		t.Errorf("only %d $refs found: the YAML reader lost part of the spec", len(refs))
	}
	for _, r := range refs {
		parts := strings.Split(strings.TrimPrefix(r, "#/"), "/")
		if !strings.HasPrefix(r, "#/") {
			t.Errorf("$ref %s is not local", r)
			continue
		}
		var cur any = spec
		for _, p := range parts {
			m, ok := cur.(map[string]any)
			if !ok {
				cur = nil
				break
			}
			cur = m[p]
		}
		if cur == nil {
			t.Errorf("$ref %s does not resolve", r)
		}
	}
}

// jsonFields lists the JSON names of a struct type's fields.
func jsonFields(typ reflect.Type) []string {
	var out []string
	for i := range typ.NumField() { // not Fields() (Go 1.26): the SDK builds with Go 1.25
		f := typ.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

func schemaProps(t *testing.T, schema map[string]any) []string {
	t.Helper()
	props, _ := schema["properties"].(map[string]any)
	var out []string
	for k := range props {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// TestSpecSchemasMatchTypes keeps components.schemas and api/types.go in
// step: the same property names for every type the server and SDK share.
func TestSpecSchemasMatchTypes(t *testing.T) {
	schemas := getMap(t, loadSpec(t), "components", "schemas")
	types := []any{
		api.ErrorBody{}, api.ErrorDetail{}, api.Resources{}, api.Network{}, api.VolumeMount{},
		api.CreateSandboxRequest{}, api.Sandbox{}, api.SandboxList{}, api.TimeoutRequest{}, api.Metrics{},
		api.UsageAmounts{}, api.UsageReport{},
		api.ExecRequest{}, api.ExecResult{}, api.ExecStarted{}, api.ExecList{}, api.OutputEvent{},
		api.SignalRequest{}, api.PTYResize{}, api.FileWritten{}, api.FileInfo{}, api.FileList{},
		api.MkdirRequest{}, api.MoveRequest{}, api.CreateKeyRequest{}, api.Key{}, api.KeyList{},
		api.Info{}, api.DriverInfo{}, api.Limits{},
		api.Quota{}, api.QuotaOverride{}, api.QuotaUsage{}, api.TenantQuotas{},
		api.TemplateBuildRequest{}, api.TemplateBuildStarted{}, api.TemplateBuild{}, api.TemplateLogEvent{},
		api.Template{}, api.TemplateList{},
		api.AuditEvent{}, api.AuditList{}, api.TenantNetwork{},
		api.CodeRequest{}, api.CodeEvent{}, api.CodeContextRequest{}, api.CodeContext{}, api.CodeContextList{}, api.CodeAuditDetail{},
		api.PauseRequest{}, api.Lifecycle{}, api.PatchSandboxRequest{}, api.CreateSnapshotRequest{}, api.Snapshot{},
		api.SnapshotList{}, api.ForkRequest{}, api.ForkResponse{}, api.ResetRequest{}, api.PutPoolRequest{},
		api.PoolStatus{}, api.Pool{}, api.PoolList{}, api.Durability{},
	}
	// Sandbox.Error's type: found by reflection so the test does not depend
	// on its Go name.
	sbxErr, _ := reflect.TypeFor[api.Sandbox]().FieldByName("Error")
	for _, v := range types {
		typ := reflect.TypeOf(v)
		t.Run(typ.Name(), func(t *testing.T) {
			s, ok := schemas[typ.Name()].(map[string]any)
			if !ok {
				t.Fatalf("no schema %s in components.schemas", typ.Name())
			}
			if got, want := schemaProps(t, s), jsonFields(typ); !slices.Equal(got, want) {
				t.Errorf("schema properties %v, Go fields %v", got, want)
			}
			if req, ok := s["required"].([]any); ok {
				fields := jsonFields(typ)
				for _, r := range req {
					if !slices.Contains(fields, r.(string)) {
						t.Errorf("required %v is not a field", r)
					}
				}
			}
		})
	}
	t.Run("StateError", func(t *testing.T) {
		s := getMap(t, schemas, "StateError")
		if got, want := schemaProps(t, s), jsonFields(sbxErr.Type.Elem()); !slices.Equal(got, want) {
			t.Errorf("schema properties %v, Go fields %v", got, want)
		}
	})
	t.Run("PTYResize.resize", func(t *testing.T) {
		s := getMap(t, schemas, "PTYResize", "properties", "resize")
		f, _ := reflect.TypeFor[api.PTYResize]().FieldByName("Resize")
		if got, want := schemaProps(t, s), jsonFields(f.Type); !slices.Equal(got, want) {
			t.Errorf("schema properties %v, Go fields %v", got, want)
		}
	})
	t.Run("ErrorCode", func(t *testing.T) {
		codes := []string{api.CodeInvalidArgument, api.CodeUnauthenticated, api.CodePermissionDenied,
			api.CodeSandboxNotFound, api.CodeExecNotFound, api.CodeTemplateNotFound, api.CodeNotFound,
			api.CodeConflict, api.CodeInvalidState, api.CodePayloadTooLarge, api.CodeQuotaExceeded,
			api.CodeRateLimited, api.CodeCapacityExhausted, api.CodeRuntimeUnavailable, api.CodeAgentUnavailable, api.CodeInternal,
			api.CodeTemplateBuilding, api.CodeTemplateBuildFailed, api.CodeTemplateUnsupported, api.CodeCapabilityUnsupported}
		var enum []string
		for _, e := range getMap(t, schemas, "ErrorCode")["enum"].([]any) {
			enum = append(enum, e.(string))
		}
		sort.Strings(codes)
		sort.Strings(enum)
		if !slices.Equal(codes, enum) {
			t.Errorf("ErrorCode enum %v, api codes %v", enum, codes)
		}
		for _, c := range codes {
			if _, ok := codeClass[c]; !ok {
				t.Errorf("the SDK has no error class for code %s", c)
			}
		}
	})
	t.Run("enums", func(t *testing.T) {
		for name, want := range map[string][]string{
			"SandboxState": {api.StateStarting, api.StateRunning, api.StatePaused, api.StateStopping, api.StateStopped, "error"},
			"ExecStatus":   {api.ExecRunning, api.ExecExited, api.ExecTimeout, api.ExecKilled, api.ExecOOM, api.ExecError},
			"StopReason": {api.StopDeleted, api.StopExpired, api.StopOOM, api.StopCrashed, api.StopHost, api.StopCreateFailed,
				api.StopNetworkLost, api.StopPoolDrained},
		} {
			var got []string
			for _, e := range getMap(t, schemas, name)["enum"].([]any) {
				got = append(got, e.(string))
			}
			sort.Strings(got)
			sort.Strings(want)
			if !slices.Equal(got, want) {
				t.Errorf("%s enum %v, want %v", name, got, want)
			}
		}
	})
}

// matchPath reports whether a concrete request path fits a spec template.
func matchPath(tmpl, path string) bool {
	ts, ps := strings.Split(tmpl, "/"), strings.Split(path, "/")
	if len(ts) != len(ps) {
		return false
	}
	for i := range ts {
		if strings.HasPrefix(ts[i], "{") || ts[i] == ps[i] {
			continue
		}
		return false
	}
	return true
}

// TestSDKCallsAreInSpec calls every SDK method against a recorder and checks
// that each request is an implemented operation of the spec: the SDK cannot
// drift from the contract.
func TestSDKCallsAreInSpec(t *testing.T) {
	paths := getMap(t, loadSpec(t), "paths")
	var mu sync.Mutex
	var seen []string
	c := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Method+" "+r.URL.Path)
		mu.Unlock()
		io.Copy(io.Discard, r.Body)
		writeAPIError(w, 404, api.CodeNotFound, "recorder")
	}))
	ctx := context.Background()
	s, e := "sbx_1", "ex_1"
	c.CreateSandbox(ctx, api.CreateSandboxRequest{})
	c.ListSandboxes(ctx, ListOptions{})
	c.GetSandbox(ctx, s)
	c.DeleteSandbox(ctx, s)
	c.SetTimeout(ctx, s, 1)
	c.Pause(ctx, s)
	c.Resume(ctx, s)
	c.Metrics(ctx, s)
	c.MetricsSeries(ctx, s, time.Time{})
	c.Usage(ctx, UsageOptions{})
	c.Exec(ctx, s, api.ExecRequest{})
	c.ExecAsync(ctx, s, api.ExecRequest{})
	Consume(c.ExecStream(ctx, s, api.ExecRequest{}), StreamHandlers{})
	Consume(c.Attach(ctx, s, e, 0), StreamHandlers{})
	c.Execs(ctx, s, ExecListOptions{})
	c.GetExec(ctx, s, e)
	c.WriteStdin(ctx, s, e, strings.NewReader("x"))
	c.CloseStdin(ctx, s, e)
	c.Signal(ctx, s, e, "SIGTERM")
	c.PTY(ctx, s, PTYOptions{})
	c.WriteFile(ctx, s, "/a", bytes.NewReader(nil))
	c.UploadTar(ctx, s, "/a", bytes.NewReader(nil))
	c.ReadFile(ctx, s, "/a")
	c.DownloadTar(ctx, s, "/a")
	c.List(ctx, s, "/", 1)
	c.Stat(ctx, s, "/a")
	c.Mkdir(ctx, s, "/a")
	c.Move(ctx, s, "/a", "/b")
	c.Remove(ctx, s, "/a", true)
	if w, err := c.WatchDir(ctx, s, "/a", WatchOptions{}); err == nil {
		w.Close()
	}
	c.CreateKey(ctx, api.CreateKeyRequest{})
	c.ListKeys(ctx)
	c.DeleteKey(ctx, "key_1")
	c.Info(ctx)
	c.Health(ctx)
	c.Ready(ctx)
	if len(seen) != 36 {
		t.Errorf("recorded %d requests, want 36: %v", len(seen), seen)
	}
	for _, req := range seen {
		method, p, _ := strings.Cut(req, " ")
		found := false
		for tmpl, v := range paths {
			item := v.(map[string]any)
			if op, ok := item[strings.ToLower(method)].(map[string]any); ok && matchPath(tmpl, p) && opStatus(item, op) == "implemented" {
				found = true
				break
			}
		}
		if !found {
			t.Errorf("SDK request %s is not an implemented operation of the spec", req)
		}
	}
}

func TestYAMLReader(t *testing.T) {
	tests := []struct {
		name, in string
		want     any
		wantErr  bool
	}{
		{name: "nested", in: "a:\n  b: 1\n  c:\n    - x\n    - \"y: z\"\n", want: map[string]any{"a": map[string]any{"b": "1", "c": []any{"x", "y: z"}}}},
		{name: "seq of maps", in: "l:\n  - name: a\n    in: q\n  - name: b\n", want: map[string]any{"l": []any{map[string]any{"name": "a", "in": "q"}, map[string]any{"name": "b"}}}},
		{name: "flow and block scalar", in: "t: [a, \"b\"]\ne: []\nd: >-\n  one\n  two\nx: {}\n", want: map[string]any{"t": []any{"a", "b"}, "e": []any{}, "d": "one two", "x": map[string]any{}}},
		{name: "comments", in: "# c\na: 1\n\n# d\nb: 2\n", want: map[string]any{"a": "1", "b": "2"}},
		{name: "duplicate key", in: "a: 1\na: 2\n", wantErr: true},
		{name: "plain colon", in: "a: b: c\n", wantErr: true},
		{name: "bad indentation", in: "a:\n    b: 1\n  c: 2\n", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseYAML(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if !tt.wantErr && !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %#v, want %#v", got, tt.want)
			}
		})
	}
}
