package redact

import (
	"bytes"
	"encoding/base64"
	"math/rand/v2"
	"net/url"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

func TestStreamRedactorSplitSecret(t *testing.T) {
	secret := "TOPSECRETVALUE"
	s := &Stream{r: New(map[string]string{"S": secret})}
	var out []Chunk
	out = append(out, s.Push(Chunk{Stream: "stdout", Off: 0, Data: []byte("key: TOPSEC")})...)
	if !s.Pending() || len(s.st["stdout"].held) != len("TOPSEC") {
		t.Fatalf("held back %q, want %q", s.st["stdout"].held, "TOPSEC")
	}
	out = append(out, s.Push(Chunk{Stream: "stdout", Off: 11, Data: []byte("RETVALUE done\n")})...)
	out = append(out, s.End()...)
	var got bytes.Buffer
	next := int64(0)
	for _, c := range out {
		if c.Off != next {
			t.Fatalf("chunk at %d, want contiguous %d", c.Off, next)
		}
		next += int64(len(c.Data))
		got.Write(c.Data)
	}
	if want := "key: " + strings.Repeat("*", len(secret)) + " done\n"; got.String() != want {
		t.Fatalf("got %q, want %q", got.String(), want)
	}
	// A secret split across two writes of stdout with stderr output in
	// between is still masked, and chunks stay in offset order.
	s = &Stream{r: New(map[string]string{"S": secret})}
	out = nil
	out = append(out, s.Push(Chunk{Stream: "stdout", Off: 0, Data: []byte("a TOPSEC")})...)
	out = append(out, s.Push(Chunk{Stream: "stderr", Off: 8, Data: []byte("warn\n")})...)
	if len(out) != 1 || string(out[0].Data) != "a " {
		t.Fatalf("before the continuation: %v", out)
	}
	out = append(out, s.Push(Chunk{Stream: "stdout", Off: 13, Data: []byte("RETVALUE!")})...)
	out = append(out, s.End()...)
	next = 0
	texts := map[string]string{}
	for _, c := range out {
		if c.Off != next {
			t.Fatalf("chunk at %d, want %d: %v", c.Off, next, out)
		}
		next += int64(len(c.Data))
		texts[c.Stream] += string(c.Data)
	}
	if texts["stdout"] != "a "+strings.Repeat("*", len(secret))+"!" || texts["stderr"] != "warn\n" {
		t.Fatalf("interleaved split secret: %q", texts)
	}
	// A held tail whose continuation never comes: a timed-out hold sends
	// it masked, the end of the output as it is.
	s = &Stream{r: New(map[string]string{"S": secret})}
	if got := s.Push(Chunk{Stream: "stdout", Off: 0, Data: []byte("TOP")}); len(got) != 0 || !s.Pending() {
		t.Fatalf("held %v, pending %v", got, s.Pending())
	}
	if got := s.Expire(); len(got) != 1 || string(got[0].Data) != "***" || s.Pending() {
		t.Fatalf("expire: %v", got)
	}
	s = &Stream{r: New(map[string]string{"S": secret})}
	s.Push(Chunk{Stream: "stdout", Off: 0, Data: []byte("TOP")})
	if got := s.End(); len(got) != 1 || string(got[0].Data) != "TOP" || s.Pending() {
		t.Fatalf("end: %v", got)
	}
}

// piece is one write of a program: after a pause, data on a stream.
type piece struct {
	pause  time.Duration
	stream string
	data   string
}

// slowly is s written one byte at a time, pause apart, on stream.
func slowly(stream, s string, pause time.Duration) []piece {
	var out []piece
	for i := range len(s) {
		out = append(out, piece{pause, stream, s[i : i+1]})
	}
	return out
}

// follow feeds pieces to a Stream as the exec tracker's run loop
// does: a pause of Hold or more after output was held lets the hold's
// timer fire first. It returns each stream's text as a live reader saw it
// and as the record keeps it (settle), checking offsets on the way.
func follow(t *testing.T, r *Redactor, pieces []piece) (live, record map[string]string) {
	t.Helper()
	s := &Stream{r: r}
	var events []Chunk
	off := int64(0)
	emit := func(cs []Chunk) {
		for _, c := range cs {
			if n := len(events); n > 0 && events[n-1].Off+int64(len(events[n-1].Data)) != c.Off {
				t.Fatalf("chunk at %d after %d+%d", c.Off, events[n-1].Off, len(events[n-1].Data))
			}
			events = append(events, c)
		}
	}
	for _, p := range pieces {
		if p.pause >= Hold && s.Pending() {
			emit(s.Expire())
		}
		emit(s.Push(Chunk{Stream: p.stream, Off: off, Data: []byte(p.data)}))
		off += int64(len(p.data))
	}
	emit(s.End())
	live, record = map[string]string{}, map[string]string{}
	for _, c := range events {
		live[c.Stream] += string(c.Data)
	}
	for _, c := range s.Settle(events) {
		record[c.Stream] += string(c.Data)
	}
	return live, record
}

// TestStreamRedactorTimings: however slowly a secret (or one of its
// encoded forms) is printed, no byte of it is ever emitted in plain, and
// the record is the whole output masked as one text. Before the fix, a
// held prefix went out in plain when its hold timed out, and the rest of
// the secret was then not recognised.
func TestStreamRedactorTimings(t *testing.T) {
	const secret = "hunter2-Secret!"
	r := New(map[string]string{"S": secret})
	b64 := base64.StdEncoding.EncodeToString([]byte(secret))
	stars := func(s string) string { return strings.Repeat("*", len(s)) }
	interleaved := func() []piece {
		var out []piece
		for i := range len(secret) {
			out = append(out, piece{30 * time.Millisecond, "stdout", secret[i : i+1]}, piece{time.Millisecond, "stderr", "."})
		}
		return out
	}
	tests := []struct {
		name         string
		pieces       []piece
		live, record map[string]string
	}{
		{"OneBytePer30ms", slowly("stdout", "key="+secret+"\n", 30*time.Millisecond),
			map[string]string{"stdout": "key=" + stars(secret) + "\n"}, map[string]string{"stdout": "key=" + stars(secret) + "\n"}},
		{"OneBytePerSecond", slowly("stdout", secret, time.Second),
			map[string]string{"stdout": stars(secret)}, map[string]string{"stdout": stars(secret)}},
		{"InterleavedStderr", interleaved(),
			map[string]string{"stdout": stars(secret), "stderr": strings.Repeat(".", len(secret))},
			map[string]string{"stdout": stars(secret), "stderr": strings.Repeat(".", len(secret))}},
		{"PauseLongerThanAnyHold", []piece{{0, "stdout", "a " + secret[:7]}, {time.Hour, "stdout", secret[7:] + " b"}},
			map[string]string{"stdout": "a " + stars(secret) + " b"}, map[string]string{"stdout": "a " + stars(secret) + " b"}},
		{"Base64Slowly", slowly("stdout", b64, 30*time.Millisecond),
			map[string]string{"stdout": stars(b64)}, map[string]string{"stdout": stars(b64)}},
		// A pause after bytes that only look like the start of a secret:
		// a live reader sees them masked, the record as they are.
		{"PromptLookalike", []piece{{0, "stdout", "user: hun"}, {time.Second, "stdout", "ter\n"}},
			map[string]string{"stdout": "user: ***ter\n"}, map[string]string{"stdout": "user: hunter\n"}},
		{"LookalikeThenSecret", []piece{{0, "stdout", "hu"}, {time.Second, "stdout", "x " + secret[:3]}, {time.Second, "stdout", secret[3:]}},
			map[string]string{"stdout": "**x " + stars(secret)}, map[string]string{"stdout": "hux " + stars(secret)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			live, record := follow(t, r, tc.pieces)
			if !mapsEqual(live, tc.live) || !mapsEqual(record, tc.record) {
				t.Fatalf("live %q record %q, want %q and %q", live, record, tc.live, tc.record)
			}
		})
	}
}

func mapsEqual(a, b map[string]string) bool {
	for k, v := range b {
		if a[k] != v {
			return false
		}
	}
	for k, v := range a {
		if b[k] != v && v != "" {
			return false
		}
	}
	return true
}

// TestStreamRedactorRandomTimings checks the redactor's two promises on
// random output, split and paused at random: every byte that the whole
// text's masking masks is masked in what a live reader sees, and the
// record equals the whole text masked.
func TestStreamRedactorRandomTimings(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := "ab-=*\n"
	for round := range 400 {
		secrets := map[string]string{}
		for i := range 1 + rng.IntN(3) {
			var sb strings.Builder
			for range 1 + rng.IntN(8) {
				sb.WriteByte(alphabet[rng.IntN(3)])
			}
			secrets[string(rune('A'+i))] = sb.String()
		}
		r := New(secrets)
		var vals []string
		for _, v := range secrets {
			vals = append(vals, v)
		}
		texts := map[string]*strings.Builder{"stdout": {}, "stderr": {}}
		var pieces []piece
		for range 1 + rng.IntN(30) {
			stream := []string{"stdout", "stderr"}[rng.IntN(2)]
			var d string
			if rng.IntN(2) == 0 {
				d = vals[rng.IntN(len(vals))]
			} else {
				d = string(alphabet[rng.IntN(len(alphabet))])
			}
			// Cut it into pieces with random pauses.
			for len(d) > 0 {
				n := 1 + rng.IntN(len(d))
				pause := []time.Duration{0, time.Millisecond, Hold, time.Second}[rng.IntN(4)]
				pieces = append(pieces, piece{pause, stream, d[:n]})
				texts[stream].WriteString(d[:n])
				d = d[n:]
			}
		}
		live, record := follow(t, r, pieces)
		for stream, b := range texts {
			whole := r.Redact(b.String())
			if record[stream] != whole {
				t.Fatalf("round %d, secrets %q: %s record %q, want %q (pieces %+v)", round, secrets, stream, record[stream], whole, pieces)
			}
			if len(live[stream]) != len(whole) {
				t.Fatalf("round %d: %s live %q has another length than %q", round, stream, live[stream], whole)
			}
			for i := range len(whole) {
				if whole[i] == '*' && b.String()[i] != '*' && live[stream][i] != '*' {
					t.Fatalf("round %d, secrets %q: %s live %q shows byte %d of a secret (whole %q, pieces %+v)", round, secrets, stream, live[stream], i, whole, pieces)
				}
			}
		}
	}
}

// TestRedactorScan compares scan's masking and hold with a brute force.
func TestRedactorScan(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 2000 {
		secrets := map[string]string{}
		for i := range 1 + rng.IntN(3) {
			b := make([]byte, 1+rng.IntN(6))
			for j := range b {
				b[j] = "abc"[rng.IntN(3)]
			}
			secrets[string(rune('A'+i))] = string(b)
		}
		r := New(secrets)
		text := make([]byte, rng.IntN(20))
		for j := range text {
			text[j] = "abc"[rng.IntN(3)]
		}
		cov := make([]bool, len(text))
		hold := r.scan(text, cov, true)
		wantHold := 0
		wantCov := make([]bool, len(text))
		for _, p := range r.patterns {
			for i := 0; i+len(p) <= len(text); i++ {
				if bytes.Equal(text[i:i+len(p)], p) {
					for k := i; k < i+len(p); k++ {
						wantCov[k] = true
					}
				}
			}
			for l := 1; l < len(p) && l <= len(text); l++ {
				if bytes.Equal(text[len(text)-l:], p[:l]) {
					wantHold = max(wantHold, l)
				}
			}
		}
		if hold != wantHold {
			t.Fatalf("patterns %q text %q: hold %d, want %d", r.patterns, text, hold, wantHold)
		}
		for i := range cov {
			if cov[i] != wantCov[i] {
				t.Fatalf("patterns %q text %q: coverage %v, want %v", r.patterns, text, cov, wantCov)
			}
		}
	}
}

// TestRedactorOverlappingSecrets: an occurrence of one secret inside or
// across another's is masked whole, whichever is found first.
func TestRedactorOverlappingSecrets(t *testing.T) {
	r := New(map[string]string{"A": "abcd", "B": "cdef"})
	if got := r.Redact("xabcdefx"); got != "x******x" {
		t.Fatalf("got %q", got)
	}
	// One secret is the start of another: the longer one is masked whole
	// in a stream too.
	r = New(map[string]string{"A": "tok", "B": "tokenvalue"})
	live, record := follow(t, r, slowly("stdout", "tokenvalue!", time.Second))
	if live["stdout"] != "**********!" || record["stdout"] != "**********!" {
		t.Fatalf("live %q record %q", live, record)
	}
}

func TestTextStream(t *testing.T) {
	const secret = "s3cr3t-é-value"
	ts := NewTextStream(map[string]string{"S": secret})
	var live strings.Builder
	for i, c := range []byte(secret) {
		live.WriteString(ts.Push(string([]byte{c})))
		if i%3 == 0 && ts.Pending() {
			live.WriteString(ts.Expire())
		}
	}
	live.WriteString(ts.Push(" end"))
	live.WriteString(ts.End())
	if got, want := live.String(), strings.Repeat("*", len(secret))+" end"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	// Text is never cut inside a UTF-8 sequence.
	ts = NewTextStream(map[string]string{"S": "é!"})
	if got := ts.Push("café"); got != "caf" || !ts.Pending() {
		t.Fatalf("Push = %q, pending %v", got, ts.Pending())
	}
	if got := ts.End(); got != "é" || !utf8.ValidString(got) {
		t.Fatalf("End = %q", got)
	}
	if got := NewTextStream(nil).Push("x"); got != "x" {
		t.Fatalf("no secrets: %q", got)
	}
}

func TestRedactorForms(t *testing.T) {
	secret := "hunter2-Secret!"
	r := New(map[string]string{"A": secret, "EMPTY": ""})
	mask := func(s string) string { return r.Redact(s) }
	tests := []struct {
		name, in string
	}{
		{"exact", "key=" + secret + ";"},
		{"base64", base64.StdEncoding.EncodeToString([]byte(secret))},
		{"base64-raw", base64.RawStdEncoding.EncodeToString([]byte(secret))},
		{"base64-url", base64.URLEncoding.EncodeToString([]byte(secret))},
		{"base64-offset-1", base64.StdEncoding.EncodeToString([]byte("x" + secret + "y"))},
		{"base64-offset-2", base64.StdEncoding.EncodeToString([]byte("xy" + secret + "z"))},
		{"query-escaped", "q=" + url.QueryEscape(secret)},
		{"path-escaped", "/p/" + url.PathEscape(secret)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := mask(tt.in)
			if len(got) != len(tt.in) {
				t.Fatalf("masking changed the length: %q → %q", tt.in, got)
			}
			if !strings.Contains(got, "*****") {
				t.Fatalf("%q not masked: %q", tt.in, got)
			}
			// No 8-character run of a secret form survives.
			for _, form := range []string{secret, base64.StdEncoding.EncodeToString([]byte(secret))} {
				for i := 0; i+8 <= len(form); i++ {
					if strings.Contains(got, form[i:i+8]) && strings.Contains(tt.in, form) {
						t.Fatalf("fragment %q of %q survives in %q", form[i:i+8], form, got)
					}
				}
			}
		})
	}
	if got := mask("nothing to see"); got != "nothing to see" {
		t.Fatalf("clean text changed: %q", got)
	}
	if !New(nil).Empty() || New(map[string]string{"E": ""}).maxLen != 0 {
		t.Fatal("empty secrets must give an empty redactor")
	}
}
