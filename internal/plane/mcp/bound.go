package mcp

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// What a tool returns is bounded by Limits, never by what a sandbox
// prints: the helpers here keep the head and the tail of a text and put a
// marker where the middle was left out, as the API does for exec output.

// marker is the text put where n bytes of what were left out.
func marker(n int64, what string) string {
	return fmt.Sprintf("\n[... %d bytes of %s left out ...]\n", n, what)
}

// clip returns s cut to its first and last limit/2 bytes (on UTF-8
// boundaries) with a marker between, and whether it cut; s is returned
// as it is when it fits.
func clip(s string, limit int, what string) (string, bool) {
	if len(s) <= limit {
		return s, false
	}
	h := limit / 2
	for h > 0 && !utf8.RuneStart(s[h]) {
		h--
	}
	t := len(s) - (limit - limit/2)
	for t < len(s) && !utf8.RuneStart(s[t]) {
		t++
	}
	return s[:h] + marker(int64(t-h), what) + s[t:], true
}

// keptStream renders a stream the API kept the head and tail of (limit
// bytes at most, dropped counted): invalid UTF-8 is replaced, and a marker
// stands where the dropped bytes were (between the halves when both are
// full, else at the end).
func keptStream(s string, dropped int64, limit int, what string) (string, bool) {
	switch {
	case dropped > 0 && len(s) == limit:
		s = s[:limit/2] + marker(dropped, what) + s[limit/2:]
	case dropped > 0:
		s += marker(dropped, what)
	case len(s) > limit:
		// A server with a larger cap than asked: cut it here.
		s, _ = clip(s, limit, what)
		dropped = 1
	}
	return strings.ToValidUTF8(s, "\uFFFD"), dropped > 0
}

// headTail keeps the first and the last halves of limit bytes written to
// it, counting what falls between: memory stays bounded whatever a cell
// prints.
type headTail struct {
	limit      int
	head, tail []byte
	total      int64
}

func newHeadTail(limit int) *headTail { return &headTail{limit: limit} }

// WriteString appends s.
func (b *headTail) WriteString(s string) {
	b.total += int64(len(s))
	if room := b.limit/2 - len(b.head); room > 0 {
		n := min(room, len(s))
		b.head = append(b.head, s[:n]...)
		s = s[n:]
	}
	if s == "" {
		return
	}
	tailCap := b.limit - b.limit/2
	b.tail = append(b.tail, s...)
	if len(b.tail) > 2*tailCap {
		b.tail = append(b.tail[:0], b.tail[len(b.tail)-tailCap:]...)
	}
}

// String returns what was kept, with a marker where bytes were left out,
// and whether any were.
func (b *headTail) String(what string) (string, bool) {
	tail := b.tail
	if tailCap := b.limit - b.limit/2; len(tail) > tailCap {
		tail = tail[len(tail)-tailCap:]
	}
	dropped := b.total - int64(len(b.head)) - int64(len(tail))
	head, t := b.head, tail
	if dropped > 0 {
		// Cut on character boundaries: a marker inside a character would
		// leave two broken halves.
		for len(head) > 0 && !utf8.FullRune(head[lastRuneStart(head):]) {
			head = head[:lastRuneStart(head)]
		}
		for len(t) > 0 && !utf8.RuneStart(t[0]) {
			t = t[1:]
		}
		dropped = b.total - int64(len(head)) - int64(len(t))
		return strings.ToValidUTF8(string(head)+marker(dropped, what)+string(t), "\uFFFD"), true
	}
	return strings.ToValidUTF8(string(head)+string(t), "\uFFFD"), false
}

// lastRuneStart is the index of the last rune start in b (0 if none).
func lastRuneStart(b []byte) int {
	for i := len(b) - 1; i > 0 && i >= len(b)-utf8.UTFMax; i-- {
		if utf8.RuneStart(b[i]) {
			return i
		}
	}
	return 0
}

// joinNotes joins notes for one note field.
func joinNotes(notes []string) string { return strings.Join(notes, "; ") }
