package cli

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/airlockhq/airlock/api"
)

// fakeCode answers POST /v1/sandboxes/sbx_1/code with a scripted stream
// and records the requests.
func fakeCode(t *testing.T) (*httptest.Server, *[]api.CodeRequest) {
	var reqs []api.CodeRequest
	png := base64.StdEncoding.EncodeToString([]byte("\x89PNG\r\n\x1a\nfake"))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/sandboxes/sbx_1/code" || r.Header.Get("Authorization") != "Bearer ak_good" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			w.Write([]byte(`{"error":{"code":"sandbox_not_found","message":"sandbox not found"}}`))
			return
		}
		var req api.CodeRequest
		json.NewDecoder(r.Body).Decode(&req)
		reqs = append(reqs, req)
		w.Header().Set("Content-Type", "application/x-ndjson")
		enc := json.NewEncoder(w)
		enc.Encode(api.CodeEvent{Type: "stdout", Text: "hello\n"})
		if strings.Contains(req.Code, "plot") {
			enc.Encode(api.CodeEvent{Type: "result", PNG: png})
		}
		if strings.Contains(req.Code, "raise") {
			enc.Encode(api.CodeEvent{Type: "error", Name: "ValueError", Value: "bad", Traceback: "Traceback…\nValueError: bad"})
		} else {
			enc.Encode(api.CodeEvent{Type: "result", IsMainResult: true, Text: "42"})
		}
		enc.Encode(api.CodeEvent{Type: "end", ExecutionCount: 3})
	}))
	t.Cleanup(srv.Close)
	return srv, &reqs
}

func TestCodeCommand(t *testing.T) {
	srv, reqs := fakeCode(t)
	dir := t.TempDir()
	script := filepath.Join(dir, "cell.py")
	os.WriteFile(script, []byte("from file"), 0o644)
	tests := []struct {
		name                string
		args                []string
		stdin               string
		wantErr             bool
		wantOut, wantErrOut string
		wantReq             api.CodeRequest
	}{
		{name: "arg", args: []string{"sbx_1", "x+1"}, wantOut: "hello\n42\n", wantReq: api.CodeRequest{Code: "x+1"}},
		{name: "stdin", args: []string{"sbx_1"}, stdin: "from stdin", wantOut: "hello\n42\n", wantReq: api.CodeRequest{Code: "from stdin"}},
		{name: "file-and-flags", args: []string{"sbx_1", "-f", script, "-l", "bash", "--context", "ctx_1", "--timeout", "2"},
			wantOut: "hello\n42\n", wantReq: api.CodeRequest{Code: "from file", Language: "bash", ContextID: ptrTo("ctx_1"), TimeoutS: ptrTo(2.0)}},
		{name: "error-exits-1", args: []string{"sbx_1", "raise"}, wantErr: true, wantOut: "hello\n", wantErrOut: "ValueError: bad",
			wantReq: api.CodeRequest{Code: "raise"}},
		{name: "image-saved", args: []string{"sbx_1", "plot", "--save-dir", dir}, wantOut: "hello\n42\n", wantErrOut: "result-1.png",
			wantReq: api.CodeRequest{Code: "plot"}},
		{name: "json", args: []string{"sbx_1", "--json", "x"}, wantOut: `{"type":"stdout","text":"hello\n"}`, wantReq: api.CodeRequest{Code: "x"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			*reqs = nil
			var out, errOut bytes.Buffer
			a := &app{stdin: strings.NewReader(tt.stdin), stdout: &out, stderr: &errOut,
				getenv: func(string) string { return "" }, url: srv.URL, apiKey: "ak_good"}
			cmd := a.newCodeCmd()
			cmd.SetArgs(tt.args)
			cmd.SetOut(&out)
			cmd.SetErr(&errOut)
			err := cmd.ExecuteContext(context.Background())
			var ec exitCodeError
			if tt.wantErr != (err != nil) || (err != nil && (!errors.As(err, &ec) || ec.code != 1)) {
				t.Fatalf("err %v", err)
			}
			if !strings.Contains(out.String(), tt.wantOut) {
				t.Errorf("stdout %q, want %q", out.String(), tt.wantOut)
			}
			if !strings.Contains(errOut.String(), tt.wantErrOut) {
				t.Errorf("stderr %q, want %q", errOut.String(), tt.wantErrOut)
			}
			if len(*reqs) != 1 {
				t.Fatalf("requests %+v", *reqs)
			}
			got, _ := json.Marshal((*reqs)[0])
			want, _ := json.Marshal(tt.wantReq)
			if !bytes.Equal(got, want) {
				t.Errorf("request %s, want %s", got, want)
			}
		})
	}
	if b, err := os.ReadFile(filepath.Join(dir, "result-1.png")); err != nil || !bytes.HasPrefix(b, []byte("\x89PNG")) {
		t.Errorf("saved image: %q %v", b, err)
	}
}

func ptrTo[T any](v T) *T { return &v }

// TestCodeCommandSandboxChoice: the sandbox comes from the first argument,
// --sandbox or $AIRLOCK_SANDBOX; with none, a one-off code-interpreter
// sandbox is created for the cell and deleted after it.
func TestCodeCommandSandboxChoice(t *testing.T) {
	code, reqs := fakeCode(t)
	var (
		mu               sync.Mutex
		creates, deletes []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case r.Method == "POST" && r.URL.Path == "/v1/sandboxes":
			var req api.CreateSandboxRequest
			json.NewDecoder(r.Body).Decode(&req)
			creates = append(creates, req.Template)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			json.NewEncoder(w).Encode(api.Sandbox{ID: "sbx_1", State: api.StateRunning})
		case r.Method == "DELETE" && r.URL.Path == "/v1/sandboxes/sbx_1":
			deletes = append(deletes, r.URL.Path)
			w.WriteHeader(http.StatusNoContent)
		default:
			// The cell itself: the code fake (which knows only sbx_1).
			req, _ := http.NewRequestWithContext(r.Context(), r.Method, code.URL+r.URL.RequestURI(), r.Body)
			req.Header = r.Header.Clone()
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				w.WriteHeader(http.StatusBadGateway)
				return
			}
			defer resp.Body.Close()
			for k, v := range resp.Header {
				w.Header()[k] = v
			}
			w.WriteHeader(resp.StatusCode)
			io.Copy(w, resp.Body)
		}
	}))
	t.Cleanup(srv.Close)
	tests := []struct {
		name         string
		args         []string
		env          string
		stdin        string
		wantCreates  []string
		wantCode     string
		wantUsageErr bool
	}{
		{name: "one_off", args: []string{"print(1)"}, wantCreates: []string{"code-interpreter"}, wantCode: "print(1)"},
		{name: "one_off_template", args: []string{"--template", "python", "x"}, wantCreates: []string{"python"}, wantCode: "x"},
		{name: "flag", args: []string{"--sandbox", "sbx_1", "x"}, wantCode: "x"},
		{name: "env", args: []string{"x"}, env: "sbx_1", wantCode: "x"},
		{name: "id_then_stdin", args: []string{"sbx_1"}, stdin: "from stdin", wantCode: "from stdin"},
		{name: "both", args: []string{"--sandbox", "sbx_1", "sbx_1", "x"}, wantUsageErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			*reqs = nil
			mu.Lock()
			creates, deletes = nil, nil
			mu.Unlock()
			var out, errOut bytes.Buffer
			a := &app{stdin: strings.NewReader(tt.stdin), stdout: &out, stderr: &errOut,
				getenv: func(k string) string {
					if k == "AIRLOCK_SANDBOX" {
						return tt.env
					}
					return ""
				}, url: srv.URL, apiKey: "ak_good"}
			cmd := a.newCodeCmd()
			cmd.SetArgs(tt.args)
			cmd.SetOut(&out)
			cmd.SetErr(&errOut)
			err := cmd.ExecuteContext(context.Background())
			if tt.wantUsageErr {
				if err == nil {
					t.Fatal("want a usage error")
				}
				return
			}
			if err != nil {
				t.Fatalf("err %v; stderr %s", err, errOut.String())
			}
			if len(*reqs) != 1 || (*reqs)[0].Code != tt.wantCode {
				t.Fatalf("cells %+v, want one of %q", *reqs, tt.wantCode)
			}
			mu.Lock()
			defer mu.Unlock()
			if !slices.Equal(creates, tt.wantCreates) {
				t.Errorf("creates %v, want %v", creates, tt.wantCreates)
			}
			if len(deletes) != len(tt.wantCreates) {
				t.Errorf("deletes %v: a one-off sandbox must be deleted, no other", deletes)
			}
		})
	}
}

// TestCodeSaveDir: --save-dir is made when missing, and a result never
// overwrites an earlier one: numbers go on from the files already there.
func TestCodeSaveDir(t *testing.T) {
	srv, reqs := fakeCode(t)
	run := func(args ...string) (string, error) {
		var out, errOut bytes.Buffer
		a := &app{stdin: strings.NewReader(""), stdout: &out, stderr: &errOut,
			getenv: func(string) string { return "" }, url: srv.URL, apiKey: "ak_good"}
		cmd := a.newCodeCmd()
		cmd.SetArgs(args)
		cmd.SetOut(&out)
		cmd.SetErr(&errOut)
		err := cmd.ExecuteContext(context.Background())
		return errOut.String(), err
	}
	dir := filepath.Join(t.TempDir(), "new", "charts")
	for i, want := range []string{"result-1.png", "result-2.png"} {
		stderr, err := run("sbx_1", "plot", "--save-dir", dir)
		if err != nil || !strings.Contains(stderr, "[saved "+filepath.Join(dir, want)+"]") {
			t.Fatalf("run %d: %v, stderr %q, want %s saved", i+1, err, stderr, want)
		}
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 2 {
		t.Errorf("save dir holds %v, want two results", ents)
	}
	// Numbered on from what is there, whatever its type.
	other := t.TempDir()
	os.WriteFile(filepath.Join(other, "result-7.svg"), []byte("<svg/>"), 0o644)
	if stderr, err := run("sbx_1", "plot", "--save-dir", other); err != nil || !strings.Contains(stderr, "result-8.png") {
		t.Errorf("after result-7.svg: %v %q", err, stderr)
	}
	if b, _ := os.ReadFile(filepath.Join(other, "result-7.svg")); string(b) != "<svg/>" {
		t.Errorf("result-7.svg overwritten: %q", b)
	}
	// A directory that cannot be made fails before the cell runs.
	file := filepath.Join(t.TempDir(), "file")
	os.WriteFile(file, nil, 0o644)
	*reqs = nil
	_, err := run("sbx_1", "plot", "--save-dir", filepath.Join(file, "sub"))
	if err == nil || !strings.Contains(err.Error(), "--save-dir") {
		t.Errorf("unmakeable --save-dir: %v", err)
	}
	if len(*reqs) != 0 {
		t.Errorf("the cell ran although its images could not be saved: %+v", *reqs)
	}
}
