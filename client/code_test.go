package client

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/api"
)

func TestRunCode(t *testing.T) {
	tests := []struct {
		name, body string
		wantErr    string
		check      func(t *testing.T, ex *Execution)
	}{
		{name: "collects", body: `{"type":"stdout","text":"a"}
{"type":"stderr","text":"w"}
{"type":"stdout","text":"b"}
{"type":"result","is_main_result":false,"png":"iVBORw=="}
{"type":"result","is_main_result":true,"text":"2","json":{"k":1}}
{"type":"error","name":"E","value":"v"}
{"type":"end","execution_count":7}
`, check: func(t *testing.T, ex *Execution) {
			if ex.Stdout != "ab" || ex.Stderr != "w" || ex.Text() != "2" || len(ex.Results) != 2 ||
				ex.Error == nil || ex.Error.Name != "E" || ex.ExecutionCount != 7 || string(ex.Results[1].JSON) != `{"k":1}` {
				t.Errorf("execution %+v", ex)
			}
		}},
		{name: "no-end", body: `{"type":"stdout","text":"a"}` + "\n", wantErr: "without an end event"},
		{name: "garbage", body: "not json\n", wantErr: "decoding code event"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method != http.MethodPost || r.URL.Path != "/v1/sandboxes/sbx_1/code" {
					http.NotFound(w, r)
					return
				}
				w.Header().Set("Content-Type", "application/x-ndjson")
				w.Write([]byte(tt.body))
			}))
			defer srv.Close()
			c, err := New(srv.URL, "k")
			if err != nil {
				t.Fatal(err)
			}
			var streamed strings.Builder
			ex, err := c.RunCode(context.Background(), "sbx_1", api.CodeRequest{Code: "1+1"},
				&CodeHandlers{OnStdout: func(s string) { streamed.WriteString(s) }})
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if streamed.String() != ex.Stdout {
				t.Errorf("handler saw %q", streamed.String())
			}
			tt.check(t, ex)
		})
	}
}

func TestCodeEventMarshal(t *testing.T) {
	tests := []struct {
		ev   api.CodeEvent
		want string
	}{
		{api.CodeEvent{Type: "result", Text: "1"}, `{"type":"result","text":"1","is_main_result":false}`},
		{api.CodeEvent{Type: "result", IsMainResult: true}, `{"type":"result","is_main_result":true}`},
		{api.CodeEvent{Type: "end", ExecutionCount: 2}, `{"type":"end","execution_count":2}`},
	}
	for _, tt := range tests {
		b, err := tt.ev.MarshalJSON()
		if err != nil || string(b) != tt.want {
			t.Errorf("%+v: %s %v, want %s", tt.ev, b, err, tt.want)
		}
	}
}
