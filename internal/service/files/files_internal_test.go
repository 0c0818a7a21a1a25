package files

import (
	"strings"
	"testing"
)

func TestCleanPath(t *testing.T) {
	tests := []struct {
		in, want string
		ok       bool
	}{
		{"/home/user/a.txt", "/home/user/a.txt", true},
		{"/home//user/./a", "/home/user/a", true},
		{"/", "/", true},
		{"/home/user/../../etc/shadow", "", false},
		{"/..", "", false},
		{"relative/path", "", false},
		{"", "", false},
		{"/a\x00b", "", false},
		{"/" + strings.Repeat("a", 5000), "", false},
		// Invalid UTF-8 would become U+FFFD on the way to the agent.
		{"/home/user/a\xff", "", false},
		{"/home/user/\xc3", "", false},
		{"/home/user/caf\u00e9 \ufffd", "/home/user/caf\u00e9 \ufffd", true},
	}
	for i, tt := range tests {
		t.Run(string(rune('a'+i)), func(t *testing.T) {
			got, err := cleanPath(tt.in, "path")
			if tt.ok != (err == nil) || got != tt.want {
				t.Fatalf("cleanPath(%q) = %q, %v", tt.in, got, err)
			}
		})
	}
}
