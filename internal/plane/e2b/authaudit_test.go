package e2b_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/airlockhq/airlock/internal/audit"
	"github.com/airlockhq/airlock/internal/plane/e2b"
)

// memSink keeps the audit events the recorder writes.
type memSink struct {
	mu  sync.Mutex
	evs []audit.Event
}

func (s *memSink) InsertAuditEvents(_ context.Context, evs []audit.Event) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.evs = append(s.evs, evs...)
	return nil
}

func (s *memSink) events() []audit.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]audit.Event(nil), s.evs...)
}

// TestAuthFailuresAudited: a wrong X-API-KEY on the control plane and a
// wrong access token on the sandbox plane are each an auth_failure event
// of the audit trail, which never holds the key or token given.
func TestAuthFailuresAudited(t *testing.T) {
	sink := &memSink{}
	rec, err := audit.New(audit.Config{Sink: sink, Logger: testLog})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rec.Close() })
	h := newHarness(t, func(c *e2b.Config) { c.Audit = rec })

	const badKey = "ak_wrong_key_value_123456"
	req, _ := http.NewRequest("GET", h.url+"/sandboxes", nil)
	req.Header.Set("X-API-KEY", badKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("wrong key: status %d, want 401", resp.StatusCode)
	}

	sb := h.create("acme")
	const badToken = "not-the-token-0123456789"
	req, _ = http.NewRequest("GET", h.url+"/health", nil)
	req.Header.Set(e2b.HeaderSandboxID, sb.SandboxID)
	req.Header.Set(e2b.HeaderAccessToken, badToken)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("wrong token: status %d, want 401", resp.StatusCode)
	}

	if err := rec.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	var planes []string
	for _, e := range sink.events() {
		if e.Type != audit.TypeAuthFailure {
			continue
		}
		d := string(e.Detail)
		if strings.Contains(d, badKey) || strings.Contains(d, badToken) {
			t.Errorf("audit detail holds the credential: %s", d)
		}
		planes = append(planes, d)
	}
	if len(planes) != 2 || !strings.Contains(planes[0], "control plane") || !strings.Contains(planes[1], "sandbox plane") {
		t.Fatalf("auth_failure events %q, want one per plane", planes)
	}
}
