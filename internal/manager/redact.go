package manager

import (
	"bytes"
	"encoding/base64"
	"net/url"
	"sort"
)

// redactor masks secret values in exec output: each occurrence of a secret,
// its base64 forms (standard and URL alphabets, at each of the three byte
// alignments it can have inside a longer base64 text) and its URL-encoded
// forms is replaced by as many '*' as it has bytes.
//
// Masking keeps the length so that output offsets (which clients use to
// re-attach) stay those of the agent's log. The cost is that a secret's
// length shows; its content does not.
type redactor struct {
	patterns [][]byte // longest first, deduplicated
	maxLen   int
}

// minEncodedLen is the shortest derived (encoded) pattern kept: shorter
// fragments would mask ordinary text and tell nothing about the secret.
const minEncodedLen = 4

func newRedactor(secrets map[string]string) *redactor {
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
	r := &redactor{patterns: pats}
	for _, p := range pats {
		r.maxLen = max(r.maxLen, len(p))
	}
	return r
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

// empty reports whether there is nothing to redact.
func (r *redactor) empty() bool { return r == nil || len(r.patterns) == 0 }

// mask replaces every pattern occurrence in b, in place.
func (r *redactor) mask(b []byte) {
	if r.empty() {
		return
	}
	for _, p := range r.patterns {
		for i := 0; i+len(p) <= len(b); {
			j := bytes.Index(b[i:], p)
			if j < 0 {
				break
			}
			for k := i + j; k < i+j+len(p); k++ {
				b[k] = '*'
			}
			i += j + len(p)
		}
	}
}

// holdback returns how many trailing bytes of b could be the start of a
// pattern that continues in the next chunk: the length of the longest
// suffix of b that is a proper prefix of some pattern.
func (r *redactor) holdback(b []byte) int {
	if r.empty() {
		return 0
	}
	best := 0
	for _, p := range r.patterns {
		n := min(len(p)-1, len(b))
		for l := n; l > best; l-- {
			if bytes.Equal(b[len(b)-l:], p[:l]) {
				best = l
				break
			}
		}
	}
	return best
}

// redactString masks s.
func (r *redactor) redactString(s string) string {
	if r.empty() {
		return s
	}
	b := []byte(s)
	r.mask(b)
	return string(b)
}

// streamRedactor redacts an ordered stream of output chunks (stdout and
// stderr interleaved, as the agent's combined log has them). A secret may
// be split across two writes of one stream, possibly with output of the
// other stream in between; so while the tail of a stream could be the start
// of a secret it is held back, and everything after it waits behind it, so
// that chunks still go out in offset order. Offsets are those of the
// agent's combined log; masking keeps lengths, so they stay valid.
type streamRedactor struct {
	r *redactor
	// queue holds chunks not yet emitted, in offset order, with private
	// copies of their data (masked as far as known).
	queue []chunk
	// hold is, per stream, how many trailing bytes of that stream's queued
	// bytes could start a secret.
	hold map[string]int
}

// chunk is one piece of output at an offset of the combined log.
type chunk struct {
	stream string
	off    int64
	data   []byte
}

// push takes the next chunk and returns what can be emitted now (masked).
func (s *streamRedactor) push(c chunk) []chunk {
	if s.r.empty() {
		return []chunk{c}
	}
	if s.hold == nil {
		s.hold = map[string]int{}
	}
	c.data = append([]byte(nil), c.data...)
	s.queue = append(s.queue, c)
	// Mask this stream's queued bytes as one text, so that a secret split
	// across its chunks is found, then write the result back.
	var idx []int
	n := 0
	for i, q := range s.queue {
		if q.stream == c.stream {
			idx = append(idx, i)
			n += len(q.data)
		}
	}
	buf := make([]byte, 0, n)
	for _, i := range idx {
		buf = append(buf, s.queue[i].data...)
	}
	s.r.mask(buf)
	pos := 0
	for _, i := range idx {
		pos += copy(s.queue[i].data, buf[pos:])
	}
	s.hold[c.stream] = s.r.holdback(buf)
	return s.release()
}

// release emits queued chunks from the head until one holds a byte that
// could start a secret.
func (s *streamRedactor) release() []chunk {
	var out []chunk
	for len(s.queue) > 0 {
		head := s.queue[0]
		total := 0
		for _, q := range s.queue {
			if q.stream == head.stream {
				total += len(q.data)
			}
		}
		free := total - s.hold[head.stream]
		if free >= len(head.data) {
			out = append(out, head)
			s.queue = s.queue[1:]
			continue
		}
		if free > 0 {
			out = append(out, chunk{stream: head.stream, off: head.off, data: head.data[:free:free]})
			s.queue[0] = chunk{stream: head.stream, off: head.off + int64(free), data: head.data[free:]}
		}
		break
	}
	if len(s.queue) == 0 {
		s.queue = nil
	}
	return out
}

// flush emits everything held (the rest of a secret did not come in time).
func (s *streamRedactor) flush() []chunk {
	out := s.queue
	s.queue = nil
	clear(s.hold)
	return out
}

// pendingLen is the longest held-back tail (0 when nothing is held).
func (s *streamRedactor) pendingLen() int {
	if len(s.queue) == 0 {
		return 0
	}
	n := 1
	for _, h := range s.hold {
		n = max(n, h)
	}
	return n
}
