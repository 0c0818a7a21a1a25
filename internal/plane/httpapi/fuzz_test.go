package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// FuzzDecodeJSON: any request body decodes into the API's request types or
// fails with a classified, client-safe error (400 or 413), never a panic;
// what decodes encodes again.
func FuzzDecodeJSON(f *testing.F) {
	for _, s := range []string{
		`{}`, `{"template":"base","env":{"A":"1"},"resources":{"cpu":0.5,"memory_mb":256},"network":{"mode":"allowlist","allow":["pypi.org"]}}`,
		`{"cmd":["echo","hi"],"stdin":"x","timeout_s":5,"pty":{"cols":80,"rows":24}}`, `{"lifecycle":{"on_timeout":"pause","idle_timeout_s":60}}`,
		`{} {}`, `{"template":`, `{"unknown":1}`, `[]`, `null`, `{"timeout_s":1e400}`, "\xff", ``, `{"metadata":{"a":"` + strings.Repeat("x", 100) + `"}}`,
	} {
		f.Add([]byte(s), "application/json")
	}
	f.Add([]byte(`{}`), "text/xml")
	f.Fuzz(func(t *testing.T, body []byte, ct string) {
		for _, dst := range []func() any{
			func() any { return &api.CreateSandboxRequest{} }, func() any { return &api.ExecRequest{} },
			func() any { return &api.PatchSandboxRequest{} }, func() any { return &api.PutPoolRequest{} },
		} {
			v := dst()
			r := httptest.NewRequest("POST", "/v1/sandboxes", bytes.NewReader(body))
			r.Header.Set("Content-Type", ct)
			err := decodeJSON(httptest.NewRecorder(), r, v, true)
			if err == nil {
				if _, err := json.Marshal(v); err != nil {
					t.Fatalf("decoded %q into %T that does not encode: %v", body, v, err)
				}
				continue
			}
			var pub *errdefs.Public
			if !errors.As(err, &pub) && !errors.Is(err, errdefs.ErrTooLarge) {
				t.Fatalf("%q: unclassified error %T %v", body, err, err)
			}
			if !errdefs.IsInvalidArgument(err) && !errors.Is(err, errdefs.ErrTooLarge) {
				t.Fatalf("%q: error of the wrong class: %v", body, err)
			}
		}
	})
}
