package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/airlockhq/airlock/api"
)

// newTestClient starts h on loopback and returns a Client for it.
func newTestClient(t *testing.T, h http.Handler, opts ...Option) *Client {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	opts = append([]Option{WithHTTPClient(&http.Client{Transport: tr})}, opts...)
	c, err := New(srv.URL, "ak_test", opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeAPIError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, api.ErrorBody{Error: api.ErrorDetail{Code: code, Message: msg, RequestID: "req_1"}})
}

func TestNew(t *testing.T) {
	t.Setenv(EnvURL, "http://10.1.2.3:9000/")
	t.Setenv(EnvAPIKey, "ak_env")
	tests := []struct {
		name, url, key string
		opts           []Option
		wantURL        string
		wantKey        string
		wantErr        bool
	}{
		{name: "defaults", wantURL: DefaultURL},
		{name: "explicit", url: "https://h.example:1/base/", key: "k", wantURL: "https://h.example:1/base", wantKey: "k"},
		{name: "env", opts: []Option{FromEnv()}, wantURL: "http://10.1.2.3:9000", wantKey: "ak_env"},
		{name: "args win over env", url: "http://127.0.0.1:1", key: "k", opts: []Option{FromEnv()}, wantURL: "http://127.0.0.1:1", wantKey: "k"},
		{name: "bad scheme", url: "ftp://x", wantErr: true},
		{name: "no host", url: "http://", wantErr: true},
		{name: "key with newline", key: "a\nb", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := New(tt.url, tt.key, tt.opts...)
			if tt.wantErr {
				if err == nil {
					t.Fatalf("New: want error, got client for %s", c.BaseURL())
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.BaseURL() != tt.wantURL || c.apiKey != tt.wantKey {
				t.Errorf("got url %q key %q, want %q %q", c.BaseURL(), c.apiKey, tt.wantURL, tt.wantKey)
			}
		})
	}
}

func TestErrorDecoding(t *testing.T) {
	tests := []struct {
		name      string
		status    int
		body      string
		header    map[string]string
		wantCode  string
		wantMsg   string
		wantIs    error
		wantNotIs error
		wantRetry time.Duration
		wantReqID string
		wantSbxID string
		retryable bool
	}{
		{name: "not found", status: 404,
			body:     `{"error":{"code":"sandbox_not_found","message":"sandbox not found","request_id":"req_9","sandbox_id":"sbx_x"}}`,
			wantCode: "sandbox_not_found", wantMsg: "sandbox not found", wantIs: ErrNotFound, wantNotIs: ErrConflict,
			wantReqID: "req_9", wantSbxID: "sbx_x"},
		{name: "quota with retry-after", status: 429, header: map[string]string{"Retry-After": "7"},
			body:     `{"error":{"code":"quota_exceeded","message":"too many sandboxes"}}`,
			wantCode: "quota_exceeded", wantIs: ErrQuotaExceeded, wantNotIs: ErrRateLimited, wantRetry: 7 * time.Second, retryable: true},
		{name: "capacity", status: 503, header: map[string]string{"Retry-After": "2", "X-Request-Id": "req_h"},
			body:     `{"error":{"code":"capacity_exhausted","message":"host full"}}`,
			wantCode: "capacity_exhausted", wantIs: ErrCapacityExhausted, wantNotIs: ErrRuntimeUnavailable,
			wantRetry: 2 * time.Second, wantReqID: "req_h", retryable: true},
		{name: "runtime unavailable", status: 503, body: `{"error":{"code":"runtime_unavailable","message":"no gvisor"}}`,
			wantCode: "runtime_unavailable", wantIs: ErrRuntimeUnavailable, wantNotIs: ErrCapacityExhausted},
		{name: "invalid state is a conflict", status: 409, body: `{"error":{"code":"invalid_state","message":"paused"}}`,
			wantCode: "invalid_state", wantIs: ErrConflict, wantNotIs: ErrNotFound},
		{name: "too large", status: 413, body: `{"error":{"code":"payload_too_large","message":"upload over 1 GiB"}}`,
			wantCode: "payload_too_large", wantIs: ErrTooLarge},
		{name: "unauthenticated", status: 401, body: `{"error":{"code":"unauthenticated","message":"missing key"}}`,
			wantCode: "unauthenticated", wantIs: ErrUnauthenticated, wantNotIs: ErrPermissionDenied},
		{name: "unknown code falls back to status", status: 404, body: `{"error":{"code":"volume_not_found","message":"x"}}`,
			wantCode: "volume_not_found", wantIs: ErrNotFound},
		{name: "proxy html", status: 502, body: "<html>\nbad gateway</html>",
			wantCode: "unavailable", wantMsg: "<html>", wantIs: ErrUnavailable, retryable: true},
		{name: "empty 500", status: 500, wantCode: "internal", wantMsg: "", wantIs: ErrInternal},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				for k, v := range tt.header {
					w.Header().Set(k, v)
				}
				w.WriteHeader(tt.status)
				io.WriteString(w, tt.body)
			}))
			_, err := c.GetSandbox(context.Background(), "sbx_x")
			var ae *APIError
			if !errors.As(err, &ae) {
				t.Fatalf("err = %v (%T), want *APIError", err, err)
			}
			if ae.StatusCode != tt.status || ae.Code != tt.wantCode {
				t.Errorf("status/code = %d %q, want %d %q", ae.StatusCode, ae.Code, tt.status, tt.wantCode)
			}
			if tt.wantMsg != "" && ae.Message != tt.wantMsg {
				t.Errorf("message = %q, want %q", ae.Message, tt.wantMsg)
			}
			if !errors.Is(err, tt.wantIs) {
				t.Errorf("errors.Is(%v, %v) = false", err, tt.wantIs)
			}
			if tt.wantNotIs != nil && errors.Is(err, tt.wantNotIs) {
				t.Errorf("errors.Is(%v, %v) = true", err, tt.wantNotIs)
			}
			if ae.RetryAfter != tt.wantRetry {
				t.Errorf("RetryAfter = %v, want %v", ae.RetryAfter, tt.wantRetry)
			}
			if ae.RequestID != tt.wantReqID || ae.SandboxID != tt.wantSbxID {
				t.Errorf("ids = %q %q, want %q %q", ae.RequestID, ae.SandboxID, tt.wantReqID, tt.wantSbxID)
			}
			if _, ok := RetryAfter(err); ok != tt.retryable {
				t.Errorf("RetryAfter ok = %v, want %v", ok, tt.retryable)
			}
			if !strings.HasSuffix(err.Error(), "("+tt.wantCode+")") {
				t.Errorf("Error() = %q, want suffix (%s)", err.Error(), tt.wantCode)
			}
		})
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		in   string
		want time.Duration
	}{
		{"", 0}, {"0", 0}, {"30", 30 * time.Second}, {"-5", 0}, {"soon", 0},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second},
		{now.Add(-time.Hour).Format(http.TimeFormat), 0},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			if got := parseRetryAfter(tt.in, now); got != tt.want {
				t.Errorf("parseRetryAfter(%q) = %v, want %v", tt.in, got, tt.want)
			}
		})
	}
}

func TestTransportErrorIsUnavailable(t *testing.T) {
	// A port that was just free: nothing listens there.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	c, err := New("http://"+addr, "k", WithHTTPClient(&http.Client{Transport: tr}))
	if err != nil {
		t.Fatal(err)
	}
	err = c.Health(context.Background())
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("err = %v, want ErrUnavailable", err)
	}
	if _, ok := RetryAfter(err); !ok {
		t.Error("transport error should be retryable")
	}
	if !strings.Contains(err.Error(), "cannot reach http://"+addr) {
		t.Errorf("message %q does not name the server", err)
	}
}

func TestAuthAndUserAgent(t *testing.T) {
	var gotAuth, gotUA, gotIdem string
	var gotBody api.CreateSandboxRequest
	c := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotAuth, gotUA, gotIdem = r.Header.Get("Authorization"), r.Header.Get("User-Agent"), r.Header.Get("Idempotency-Key")
		dec := json.NewDecoder(r.Body)
		dec.DisallowUnknownFields()
		if err := dec.Decode(&gotBody); err != nil {
			writeAPIError(w, 400, api.CodeInvalidArgument, err.Error())
			return
		}
		writeJSON(w, 201, api.Sandbox{ID: "sbx_1", State: api.StateRunning, Template: gotBody.Template})
	}), WithUserAgent("test-agent/1"))
	ttl := int64(60)
	sbx, err := c.CreateSandbox(context.Background(), api.CreateSandboxRequest{
		Template: "python", TimeoutS: &ttl, Metadata: map[string]string{"user": "u-42"},
	}, WithIdempotencyKey("idem-1"))
	if err != nil {
		t.Fatal(err)
	}
	if sbx.ID != "sbx_1" || sbx.Template != "python" {
		t.Errorf("sandbox = %+v", sbx)
	}
	if gotAuth != "Bearer ak_test" || gotUA != "test-agent/1" || gotIdem != "idem-1" {
		t.Errorf("headers: auth %q ua %q idem %q", gotAuth, gotUA, gotIdem)
	}
	if gotBody.TimeoutS == nil || *gotBody.TimeoutS != 60 || gotBody.Metadata["user"] != "u-42" {
		t.Errorf("server got body %+v", gotBody)
	}
}

func TestSandboxesIterator(t *testing.T) {
	all := []string{"sbx_a", "sbx_b", "sbx_c", "sbx_d", "sbx_e"}
	var queries []string
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		queries = append(queries, r.URL.RawQuery)
		if q.Get("state") != "running" || q.Get("metadata.user") != "u-42" {
			writeAPIError(w, 400, api.CodeInvalidArgument, "filters lost")
			return
		}
		start := 0
		if cur := q.Get("cursor"); cur != "" {
			for i, id := range all {
				if "c-"+id == cur {
					start = i
				}
			}
		}
		end := min(start+2, len(all))
		var page api.SandboxList
		for _, id := range all[start:end] {
			page.Sandboxes = append(page.Sandboxes, api.Sandbox{ID: id})
		}
		if end < len(all) {
			page.NextCursor = "c-" + all[end]
		}
		writeJSON(w, 200, page)
	})
	c := newTestClient(t, mux)
	var got []string
	for s, err := range c.Sandboxes(context.Background(), ListOptions{State: "running", Metadata: map[string]string{"user": "u-42"}, Limit: 2}) {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, s.ID)
	}
	if strings.Join(got, ",") != strings.Join(all, ",") {
		t.Errorf("got %v, want %v", got, all)
	}
	if len(queries) != 3 {
		t.Errorf("pages fetched = %d (%v), want 3", len(queries), queries)
	}

	// Breaking out of the loop stops fetching.
	queries = nil
	for range c.Sandboxes(context.Background(), ListOptions{State: "running", Metadata: map[string]string{"user": "u-42"}}) {
		break
	}
	if len(queries) != 1 {
		t.Errorf("after break: pages fetched = %d, want 1", len(queries))
	}
}

func TestSandboxesIteratorStopsOnRepeatedCursor(t *testing.T) {
	c := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, api.SandboxList{Sandboxes: []api.Sandbox{{ID: "sbx_a"}}, NextCursor: "same"})
	}))
	n := 0
	var last error
	for _, err := range c.Sandboxes(context.Background(), ListOptions{}) {
		n++
		last = err
		if n > 10 {
			t.Fatal("iterator loops on a repeated cursor")
		}
	}
	if last == nil {
		t.Error("want an error for a repeated cursor")
	}
}

func TestSandboxLifecycleCalls(t *testing.T) {
	type call struct{ method, path, body string }
	var calls []call
	mux := http.NewServeMux()
	record := func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		calls = append(calls, call{r.Method, r.URL.Path, strings.TrimSpace(string(b))})
	}
	mux.HandleFunc("POST /v1/sandboxes/{id}/timeout", func(w http.ResponseWriter, r *http.Request) {
		record(w, r)
		writeJSON(w, 200, api.Sandbox{ID: r.PathValue("id"), State: api.StateRunning})
	})
	mux.HandleFunc("POST /v1/sandboxes/{id}/pause", func(w http.ResponseWriter, r *http.Request) {
		record(w, r)
		writeJSON(w, 200, api.Sandbox{ID: r.PathValue("id"), State: api.StatePaused})
	})
	mux.HandleFunc("POST /v1/sandboxes/{id}/resume", func(w http.ResponseWriter, r *http.Request) {
		record(w, r)
		writeJSON(w, 200, api.Sandbox{ID: r.PathValue("id"), State: api.StateRunning})
	})
	mux.HandleFunc("GET /v1/sandboxes/{id}/metrics", func(w http.ResponseWriter, r *http.Request) {
		record(w, r)
		writeJSON(w, 200, api.Metrics{PIDs: 3, MemoryBytes: 1 << 20})
	})
	mux.HandleFunc("DELETE /v1/sandboxes/{id}", func(w http.ResponseWriter, r *http.Request) {
		record(w, r)
		w.WriteHeader(204)
	})
	c := newTestClient(t, mux)
	ctx := context.Background()
	if _, err := c.SetTimeout(ctx, "sbx_1", 600); err != nil {
		t.Fatal(err)
	}
	if s, err := c.Pause(ctx, "sbx_1"); err != nil || s.State != api.StatePaused {
		t.Fatalf("Pause = %+v, %v", s, err)
	}
	if s, err := c.Resume(ctx, "sbx_1"); err != nil || s.State != api.StateRunning {
		t.Fatalf("Resume = %+v, %v", s, err)
	}
	if m, err := c.Metrics(ctx, "sbx_1"); err != nil || m.PIDs != 3 || m.MemoryBytes != 1<<20 {
		t.Fatalf("Metrics = %+v, %v", m, err)
	}
	if err := c.DeleteSandbox(ctx, "sbx_1"); err != nil {
		t.Fatal(err)
	}
	want := []call{
		{"POST", "/v1/sandboxes/sbx_1/timeout", `{"timeout_s":600}`},
		{"POST", "/v1/sandboxes/sbx_1/pause", ""},
		{"POST", "/v1/sandboxes/sbx_1/resume", ""},
		{"GET", "/v1/sandboxes/sbx_1/metrics", ""},
		{"DELETE", "/v1/sandboxes/sbx_1", ""},
	}
	if len(calls) != len(want) {
		t.Fatalf("calls = %v, want %v", calls, want)
	}
	for i := range want {
		if calls[i] != want[i] {
			t.Errorf("call %d = %+v, want %+v", i, calls[i], want[i])
		}
	}
}

func TestPathEscaping(t *testing.T) {
	var gotRaw string
	c := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotRaw = r.URL.EscapedPath()
		writeAPIError(w, 404, api.CodeSandboxNotFound, "sandbox not found")
	}))
	_, err := c.GetSandbox(context.Background(), "../keys")
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("err = %v", err)
	}
	if gotRaw != "/v1/sandboxes/..%2Fkeys" {
		t.Errorf("path = %q: an id must stay one path segment", gotRaw)
	}
}

func TestKeysAndInfo(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/keys", func(w http.ResponseWriter, r *http.Request) {
		var req api.CreateKeyRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Tenant == "" {
			writeAPIError(w, 400, api.CodeInvalidArgument, "tenant required")
			return
		}
		writeJSON(w, 201, api.Key{ID: "key_1", Tenant: req.Tenant, Name: req.Name, Key: "ak_secret"})
	})
	mux.HandleFunc("GET /v1/keys", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, api.KeyList{Keys: []api.Key{{ID: "key_1", Tenant: "t1"}, {ID: "key_2", Tenant: "t2"}}})
	})
	mux.HandleFunc("DELETE /v1/keys/{id}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("id") != "key_1" {
			writeAPIError(w, 404, api.CodeNotFound, "key not found")
			return
		}
		w.WriteHeader(204)
	})
	mux.HandleFunc("GET /v1/info", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, api.Info{Version: "1.2.3", Drivers: []api.DriverInfo{{Name: "runc", Health: "healthy", Default: true}}})
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") == "" {
			t.Error("client sends its key to /healthz too (harmless, but expected)")
		}
		io.WriteString(w, "ok")
	})
	c := newTestClient(t, mux)
	ctx := context.Background()
	k, err := c.CreateKey(ctx, api.CreateKeyRequest{Tenant: "t1", Name: "ci"})
	if err != nil || k.Key != "ak_secret" || k.Tenant != "t1" {
		t.Fatalf("CreateKey = %+v, %v", k, err)
	}
	if _, err := c.CreateKey(ctx, api.CreateKeyRequest{}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("CreateKey without tenant: %v", err)
	}
	keys, err := c.ListKeys(ctx)
	if err != nil || len(keys) != 2 || keys[1].ID != "key_2" {
		t.Fatalf("ListKeys = %+v, %v", keys, err)
	}
	if err := c.DeleteKey(ctx, "key_1"); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteKey(ctx, "key_9"); !errors.Is(err, ErrNotFound) {
		t.Errorf("DeleteKey unknown: %v", err)
	}
	info, err := c.Info(ctx)
	if err != nil || info.Version != "1.2.3" || len(info.Drivers) != 1 || !info.Drivers[0].Default {
		t.Fatalf("Info = %+v, %v", info, err)
	}
	if err := c.Health(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Ready(ctx); !errors.Is(err, ErrNotFound) {
		t.Errorf("Ready on a server without /readyz: %v", err)
	}
}

// jsonDecodeStrict decodes r's body like the server: unknown fields are errors.
func jsonDecodeStrict(r *http.Request, v any) error {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

// TestTemplateBuilding: a create refused while its template is built is
// told apart from other 503s by its code, never by its message, and names
// the build.
func TestTemplateBuilding(t *testing.T) {
	tests := []struct {
		name, code, msg, buildID string
		want                     bool
	}{
		{"building", "template_building", "template code-interpreter is being built; retry when it is ready", "bld_1", true},
		{"building_other_words", "template_building", "anything at all", "bld_2", true},
		{"unavailable_with_the_old_text", "unavailable", "template code-interpreter is being built (build bld_1, …)", "", false},
		{"capacity", "capacity_exhausted", "template is being built elsewhere", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.Header().Set("Retry-After", "60")
				w.WriteHeader(http.StatusServiceUnavailable)
				fmt.Fprintf(w, `{"error":{"code":%q,"message":%q,"build_id":%q}}`, tt.code, tt.msg, tt.buildID)
			}))
			defer srv.Close()
			c, err := New(srv.URL, "ak_x")
			if err != nil {
				t.Fatal(err)
			}
			_, err = c.CreateSandbox(context.Background(), api.CreateSandboxRequest{})
			if got := TemplateBuilding(err); got != tt.want {
				t.Fatalf("TemplateBuilding(%v) = %v, want %v", err, got, tt.want)
			}
			if got := BuildOf(err); got != tt.buildID {
				t.Errorf("BuildOf = %q, want %q", got, tt.buildID)
			}
			if d, ok := RetryAfter(err); tt.want && (!ok || d != time.Minute) {
				t.Errorf("RetryAfter = %v, %v; want 1m, true", d, ok)
			}
		})
	}
}
