package previews

import (
	"strings"
	"testing"
)

func TestParseHost(t *testing.T) {
	tests := []struct {
		host, domain string
		id           string
		port         int
		ok           bool
	}{
		{"8080-sbx_abc.localhost", "localhost", "sbx_abc", 8080, true},
		{"8080-sbx_abc.localhost:7071", "localhost", "sbx_abc", 8080, true},
		{"8080-sbx_abc.preview.example.org.", "preview.example.org", "sbx_abc", 8080, true},
		{"80-sbx_abc.x.localhost", "localhost", "", 0, false},
		{"08080-sbx_abc.localhost", "localhost", "", 0, false},
		{"70000-sbx_abc.localhost", "localhost", "", 0, false},
		{"0-sbx_abc.localhost", "localhost", "", 0, false},
		{"sbx_abc.localhost", "localhost", "", 0, false},
		{"8080-.localhost", "localhost", "", 0, false},
		{"8080-sbx_abc.localhostx", "localhost", "", 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.host, func(t *testing.T) {
			id, port, ok := ParseHost(tc.host, tc.domain)
			if id != tc.id || port != tc.port || ok != tc.ok {
				t.Fatalf("got %q %d %v", id, port, ok)
			}
		})
	}
}

func TestURLAndToken(t *testing.T) {
	if got := URL("localhost", "127.0.0.1:7071", "sbx_Ab", 8080); got != "http://8080-sbx_ab.localhost:7071/" {
		t.Fatalf("url %s", got)
	}
	id, port, ok := ParseHost(strings.TrimSuffix(strings.TrimPrefix(URL("", "[::1]:80", "sbx_x", 3000), "http://"), "/"), "localhost")
	if !ok || id != "sbx_x" || port != 3000 {
		t.Fatalf("round trip: %q %d %v", id, port, ok)
	}
	k1, k2 := []byte("key-one"), []byte("key-two")
	if a, b := TokenFor(k1, "sbx_a"), TokenFor(append([]byte(nil), k1...), "sbx_a"); a != b {
		t.Fatal("token is not stable")
	}
	if TokenFor(k1, "sbx_a") == TokenFor(k1, "sbx_b") || TokenFor(k1, "sbx_a") == TokenFor(k2, "sbx_a") {
		t.Fatal("tokens collide across sandboxes or keys")
	}
}
