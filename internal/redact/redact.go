// Package redact masks a sandbox's secret values in what leaves the sandbox: exec output (in order, with
// holds for a secret split over writes), code cells' text streams, file downloads and audit details.
//
// Masking keeps the length of what it masks, so that output offsets (which clients use to re-attach) stay
// those of the agent's log.
package redact

import (
	"bytes"
	"encoding/base64"
	"net/url"
	"slices"
	"sort"
	"strings"
	"time"
	"unicode/utf8"
)

// Hold is how long output that could be the start of a secret is held
// back waiting for the rest. A secret written in one write(2) arrives in one
// piece, a split one usually within microseconds; a pause after a possible
// start is an interactive prompt, a keystroke's echo or a secret printed
// slowly. When the hold ends the held bytes go out masked ('*'), so its
// length only trades latency for fewer masked lookalikes: it is short, for
// terminals.
const Hold = 20 * time.Millisecond

// Redactor masks secret values in exec output: each occurrence of a secret,
// its base64 forms (standard and URL alphabets, at each of the three byte
// alignments it can have inside a longer base64 text) and its URL-encoded
// forms is replaced by as many '*' as it has bytes.
//
// Masking keeps the length so that output offsets (which clients use to
// re-attach) stay those of the agent's log. The cost is that a secret's
// length shows; its content does not.
type Redactor struct {
	patterns [][]byte  // longest first, deduplicated
	prefix   [][]int32 // each pattern's prefix function (KMP), for holds
	maxLen   int
}

// minEncodedLen is the shortest derived (encoded) pattern kept: shorter
// fragments would mask ordinary text and tell nothing about the secret.
const minEncodedLen = 4

// New returns a Redactor of the values of secrets (empty ones are ignored).
func New(secrets map[string]string) *Redactor {
	seen := map[string]bool{}
	var pats [][]byte
	add := func(p string, derived bool) {
		if p == "" || seen[p] || (derived && len(p) < minEncodedLen) {
			return
		}
		seen[p] = true
		pats = append(pats, []byte(p))
	}
	for _, v := range secrets {
		if v == "" {
			continue
		}
		add(v, false)
		add(base64.StdEncoding.EncodeToString([]byte(v)), true)
		add(base64.RawStdEncoding.EncodeToString([]byte(v)), true)
		add(base64.URLEncoding.EncodeToString([]byte(v)), true)
		for k := 0; k < 3; k++ {
			core := base64Core([]byte(v), k)
			add(core, true)
			add(toURLAlphabet(core), true)
		}
		add(url.QueryEscape(v), true)
		add(url.PathEscape(v), true)
	}
	sort.Slice(pats, func(i, j int) bool { return len(pats[i]) > len(pats[j]) })
	r := &Redactor{patterns: pats}
	for _, p := range pats {
		r.maxLen = max(r.maxLen, len(p))
		r.prefix = append(r.prefix, prefixFunction(p))
	}
	return r
}

// prefixFunction returns, for each i, the length of the longest proper
// prefix of p[:i+1] that is also its suffix.
func prefixFunction(p []byte) []int32 {
	pi := make([]int32, len(p))
	for i, k := 1, int32(0); i < len(p); i++ {
		for k > 0 && p[i] != p[k] {
			k = pi[k-1]
		}
		if p[i] == p[k] {
			k++
		}
		pi[i] = k
	}
	return pi
}

// base64Core returns the base64 characters that depend only on v's bytes
// when v starts k bytes into a 3-byte group of a longer encoded text.
func base64Core(v []byte, k int) string {
	buf := make([]byte, k+len(v))
	copy(buf[k:], v)
	enc := base64.StdEncoding.EncodeToString(buf)
	// Character i covers bits [6i, 6i+6); v's bits are [8k, 8(k+len(v))).
	first := (8*k + 5) / 6
	last := (8 * (k + len(v))) / 6 // exclusive
	if last <= first || last > len(enc) {
		return ""
	}
	return enc[first:last]
}

func toURLAlphabet(s string) string {
	b := []byte(s)
	for i, c := range b {
		switch c {
		case '+':
			b[i] = '-'
		case '/':
			b[i] = '_'
		}
	}
	return string(b)
}

// Empty reports whether there is nothing to redact.
func (r *Redactor) Empty() bool { return r == nil || len(r.patterns) == 0 }

// Func is r as a function for the audit writer (audit.Redactor), nil when
// there is nothing to mask.
func (r *Redactor) Func() func(string) string {
	if r.Empty() {
		return nil
	}
	return r.Redact
}

// TextStream returns a TextStream masking r's secrets.
func (r *Redactor) TextStream() *TextStream { return &TextStream{r: r} }

// scan marks in cov (as long as text) every byte of text that lies inside
// an occurrence of a pattern, overlapping occurrences included. With
// withHold it also returns the length of the longest suffix of text that is
// a proper prefix of a pattern: bytes that could be the start of a secret
// continuing after text.
func (r *Redactor) scan(text []byte, cov []bool, withHold bool) (hold int) {
	for n, p := range r.patterns {
		until := 0 // cov is already set below this index for p
		for i := 0; i+len(p) <= len(text); {
			j := bytes.Index(text[i:], p)
			if j < 0 {
				break
			}
			s := i + j
			for k := max(s, until); k < s+len(p); k++ {
				cov[k] = true
			}
			until = s + len(p)
			i = s + 1
		}
		if !withHold {
			continue
		}
		// The longest proper prefix of p ending text lies in its last
		// len(p)-1 bytes: run p's automaton over them.
		w := min(len(p)-1, len(text))
		if w <= hold {
			continue
		}
		pf, q := r.prefix[n], int32(0)
		for _, c := range text[len(text)-w:] {
			for q > 0 && p[q] != c {
				q = pf[q-1]
			}
			if p[q] == c {
				q++
			}
			if int(q) == len(p) {
				q = pf[q-1]
			}
		}
		hold = max(hold, int(q))
	}
	return hold
}

// mask replaces, in place, every byte of b inside an occurrence of a
// pattern.
func (r *Redactor) mask(b []byte) {
	if r.Empty() {
		return
	}
	cov := make([]bool, len(b))
	r.scan(b, cov, false)
	for i, c := range cov {
		if c {
			b[i] = '*'
		}
	}
}

// Redact masks s.
func (r *Redactor) Redact(s string) string {
	if r.Empty() {
		return s
	}
	b := []byte(s)
	r.mask(b)
	return string(b)
}

// streamState is what the redaction of one ordered stream remembers between
// its pieces, so that a secret is masked however its bytes are spread in
// time:
//
//   - held: bytes that could be the start of a secret (the longest suffix of
//     the text so far that is a proper prefix of a pattern) are not final
//     until the next piece tells, or until the holder gives up waiting
//     (expire): then they go out as '*', which is all a reader can see of
//     them however long the pause.
//   - tail: the last maxLen-1 bytes of final text, kept in the original, so
//     that a secret whose first bytes went out (as '*') is recognised when
//     its last bytes come, and those are masked too.
//
// Together: a byte inside an occurrence of a secret is held (it ends a
// proper prefix of one) from its arrival until the occurrence is complete,
// so it never goes out in plain.
type streamState struct {
	tail    []byte
	held    []byte
	heldCov []bool // held bytes already inside a whole occurrence
	// track keeps each byte's offset (exec output), for the final record.
	track            bool
	tailOff, heldOff []int64
}

// feed adds data, whose first byte is at offset off. It returns the masked
// text of the previously held bytes followed by data, of which the last
// hold bytes are held now. confirm, when set, is called with the offset of
// each tail byte that a now complete occurrence covers. With runes the
// final part never ends inside a UTF-8 sequence.
func (s *streamState) feed(r *Redactor, data []byte, off int64, runes bool, confirm func(int64)) (region []byte, hold int) {
	nt := len(s.tail)
	text := make([]byte, 0, nt+len(s.held)+len(data))
	text = append(append(append(text, s.tail...), s.held...), data...)
	cov := make([]bool, len(text))
	hold = r.scan(text, cov, true)
	region = append([]byte(nil), text[nt:]...)
	hold = min(hold, len(region))
	for i := range region {
		if cov[nt+i] {
			region[i] = '*'
		}
	}
	if confirm != nil && s.track {
		for i := range nt {
			if cov[i] {
				confirm(s.tailOff[i])
			}
		}
	}
	final := len(region) - hold
	if runes {
		final = runeCut(text[nt:], final)
		hold = len(region) - final
	}
	keep := r.maxLen - 1
	if s.track {
		// Offsets of region's bytes: the held ones', then data's.
		offAt := func(i int) int64 {
			if i < len(s.heldOff) {
				return s.heldOff[i]
			}
			return off + int64(i-len(s.heldOff))
		}
		offsOf := func(from, to int) []int64 {
			o := make([]int64, 0, to-from)
			for i := from; i < to; i++ {
				o = append(o, offAt(i))
			}
			return o
		}
		from := max(0, final-keep)
		tailOff := lastN(s.tailOff, offsOf(from, final), keep)
		s.heldOff = offsOf(final, len(region))
		s.tailOff = tailOff
	}
	s.tail = lastN(s.tail, text[nt:nt+final], keep)
	s.held = slices.Clone(text[nt+final:])
	s.heldCov = slices.Clone(cov[nt+final:])
	return region, hold
}

// appendTail adds final bytes b (at offsets offs[:len(b)] when tracked) to
// the tail, keeping its last keep bytes.
func (s *streamState) appendTail(keep int, b []byte, offs []int64) {
	s.tail = lastN(s.tail, b, keep)
	if s.track {
		s.tailOff = lastN(s.tailOff, offs[:len(b)], keep)
	}
}

// lastN returns a new slice of the last n elements of a followed by b.
func lastN[T any](a, b []T, n int) []T {
	if len(b) >= n {
		return slices.Clone(b[len(b)-n:])
	}
	if k := len(a) + len(b) - n; k > 0 {
		a = a[k:]
	}
	return append(slices.Clone(a), b...)
}

// heldText is the held bytes as they would go out if the stream ended now.
func (s *streamState) heldText() []byte {
	out := slices.Clone(s.held)
	for i, c := range s.heldCov {
		if c {
			out[i] = '*'
		}
	}
	return out
}

// expire gives up waiting for the held bytes: they go out as '*' (the
// caller writes them) and become final text, so that the rest of a secret
// is still masked when it comes. It returns how many bytes it released,
// and calls provisional with the offset and original of each one that no
// whole occurrence covers yet: it may be plain text that only looks like
// the start of a secret.
func (s *streamState) expire(keep int, provisional func(off int64, b byte)) int {
	n := len(s.held)
	if provisional != nil && s.track {
		for i, b := range s.held {
			if !s.heldCov[i] {
				provisional(s.heldOff[i], b)
			}
		}
	}
	s.appendTail(keep, s.held, s.heldOff)
	s.held, s.heldCov, s.heldOff = nil, nil, nil
	return n
}

// end drops the held bytes: the stream is over, they cannot grow into a
// secret any more (heldText is what they are).
func (s *streamState) end() {
	s.held, s.heldCov, s.heldOff = nil, nil, nil
}

// runeCut returns n, or less so that b[:n] does not end inside a UTF-8
// sequence.
func runeCut(b []byte, n int) int {
	for i := n; i > 0 && n-i < utf8.UTFMax; i-- {
		if utf8.RuneStart(b[i-1]) {
			if !utf8.FullRune(b[i-1 : n]) {
				return i - 1
			}
			return n
		}
	}
	return n
}

// maxProvisional bounds the bytes an exec's redaction remembers as masked
// only provisionally (see Stream.Settle): past it, later ones stay
// masked in the record too, the safe side.
const maxProvisional = 1 << 16

// Stream redacts an exec's ordered output chunks (stdout and stderr
// interleaved, as the agent's combined log has them), each stream with its
// streamState. While the tail of a stream is held, everything after it
// waits behind it, so that chunks go out in offset order. Offsets are those
// of the agent's combined log; masking keeps lengths, so they stay valid.
//
// The owner calls Push for each chunk; Expire once a hold has lasted
// Hold (Pending tells whether one runs); and End, then Settle, when
// the output is over.
type Stream struct {
	r *Redactor
	// queue holds chunks not yet emitted, in offset order, with private
	// copies of their data, masked as far as known: a stream's last
	// len(held) queued bytes are its held ones.
	queue  []Chunk
	st     map[string]*streamState
	queued map[string]int // bytes of each stream in queue
	// prov maps the offset of each byte that expire masked without a
	// whole occurrence covering it to its original.
	prov map[int64]byte
}

// NewStream returns a Stream masking r's secrets.
func NewStream(r *Redactor) *Stream { return &Stream{r: r} }

// Chunk is one piece of output at an offset of the combined log.
type Chunk struct {
	Stream string
	Off    int64
	Data   []byte
}

func (s *Stream) state(stream string) *streamState {
	if s.st == nil {
		s.st, s.queued, s.prov = map[string]*streamState{}, map[string]int{}, map[int64]byte{}
	}
	st := s.st[stream]
	if st == nil {
		st = &streamState{track: true}
		s.st[stream] = st
	}
	return st
}

// Push takes the next chunk and returns what can be emitted now (masked).
func (s *Stream) Push(c Chunk) []Chunk {
	if s.r.Empty() {
		return []Chunk{c}
	}
	st := s.state(c.Stream)
	region, _ := st.feed(s.r, c.Data, c.Off, false, func(off int64) { delete(s.prov, off) })
	old := len(region) - len(c.Data)
	s.writeBack(c.Stream, region[:old])
	s.queue = append(s.queue, Chunk{Stream: c.Stream, Off: c.Off, Data: region[old:]})
	s.queued[c.Stream] += len(c.Data)
	return s.release()
}

// writeBack overwrites the last len(b) queued bytes of stream with b.
func (s *Stream) writeBack(stream string, b []byte) {
	for i := len(s.queue) - 1; i >= 0 && len(b) > 0; i-- {
		q := s.queue[i]
		if q.Stream != stream {
			continue
		}
		n := min(len(q.Data), len(b))
		copy(q.Data[len(q.Data)-n:], b[len(b)-n:])
		b = b[:len(b)-n]
	}
}

// release emits queued chunks from the head until one holds a byte that
// could start a secret.
func (s *Stream) release() []Chunk {
	var out []Chunk
	for len(s.queue) > 0 {
		head := s.queue[0]
		free := s.queued[head.Stream] - len(s.st[head.Stream].held)
		if free >= len(head.Data) {
			out = append(out, head)
			s.queue = s.queue[1:]
			s.queued[head.Stream] -= len(head.Data)
			continue
		}
		if free > 0 {
			out = append(out, Chunk{Stream: head.Stream, Off: head.Off, Data: head.Data[:free:free]})
			s.queue[0] = Chunk{Stream: head.Stream, Off: head.Off + int64(free), Data: head.Data[free:]}
			s.queued[head.Stream] -= free
		}
		break
	}
	if len(s.queue) == 0 {
		s.queue = nil
	}
	return out
}

// Pending reports whether some output is held back.
func (s *Stream) Pending() bool { return len(s.queue) > 0 }

// Expire emits everything held, the held bytes as '*' (the rest of a
// secret did not come in time, or it was no secret: see Settle).
func (s *Stream) Expire() []Chunk {
	for name, st := range s.st {
		if n := len(st.held); n > 0 {
			s.writeBack(name, bytes.Repeat([]byte{'*'}, n))
			st.expire(s.r.maxLen-1, func(off int64, b byte) {
				if len(s.prov) < maxProvisional {
					s.prov[off] = b
				}
			})
		}
	}
	return s.drain()
}

// End emits everything held as the whole output says: the output is over,
// so held bytes that are no secret go out as they are.
func (s *Stream) End() []Chunk {
	for _, st := range s.st {
		st.end()
	}
	return s.drain()
}

func (s *Stream) drain() []Chunk {
	out := s.queue
	s.queue = nil
	clear(s.queued)
	return out
}

// Settle returns the output's final events (the record): events, in offset
// order, with each byte that expire masked provisionally and that never
// became part of a secret given back, so that the record is the whole
// output masked as one text. Changed chunks are copies: readers may hold
// the old ones.
func (s *Stream) Settle(events []Chunk) []Chunk {
	fix := s.Restore()
	if len(fix) == 0 {
		return events
	}
	offs := make([]int64, 0, len(fix))
	for off := range fix {
		offs = append(offs, off)
	}
	slices.Sort(offs)
	out := slices.Clone(events)
	copied := map[int]bool{}
	for _, off := range offs {
		i := sort.Search(len(out), func(i int) bool { return out[i].Off+int64(len(out[i].Data)) > off })
		if i == len(out) || out[i].Off > off {
			continue
		}
		if !copied[i] {
			out[i].Data = slices.Clone(out[i].Data)
			copied[i] = true
		}
		out[i].Data[off-out[i].Off] = fix[off]
	}
	return out
}

// Restore returns, by offset, the original of every byte a timed-out hold
// masked without its ever becoming part of a secret, and forgets them: the
// caller writes them back into the settled output.
func (s *Stream) Restore() map[int64]byte {
	fix := s.prov
	if len(fix) == 0 {
		return nil
	}
	s.prov = map[int64]byte{}
	return fix
}

// TextStream masks a sandbox's secrets in one ordered text stream (a code
// cell's stdout or stderr) whatever the timing of its pieces, as exec
// output is (streamState): Push returns what may go out now; while Pending,
// call Expire once Hold has passed (the held text goes out as '*');
// End when the stream is over. UTF-8 sequences are kept whole.
type TextStream struct {
	r  *Redactor
	st streamState
}

// NewTextStream returns a TextStream for secrets (code services' tests use
// it; a sandbox's own comes from Redactor.TextStream).
func NewTextStream(secrets map[string]string) *TextStream {
	return &TextStream{r: New(secrets)}
}

// Push takes the next piece of text and returns what can go out now.
func (t *TextStream) Push(s string) string {
	if t.r.Empty() {
		return s
	}
	region, hold := t.st.feed(t.r, []byte(s), 0, true, nil)
	return string(region[:len(region)-hold])
}

// Pending reports whether text is held back.
func (t *TextStream) Pending() bool { return len(t.st.held) > 0 }

// Expire releases the held text as '*'.
func (t *TextStream) Expire() string {
	if t.r.Empty() {
		return ""
	}
	return strings.Repeat("*", t.st.expire(t.r.maxLen-1, nil))
}

// End releases the held text: the stream is over.
func (t *TextStream) End() string {
	out := string(t.st.heldText())
	t.st.end()
	return out
}
