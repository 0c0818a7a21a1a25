package template

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// progress writes one human-readable line per build step with the seconds
// elapsed since the build started.
type progress struct {
	mu    sync.Mutex
	w     io.Writer
	start time.Time
}

func newProgress(w io.Writer) *progress {
	if w == nil {
		w = io.Discard
	}
	return &progress{w: w, start: time.Now()}
}

func (p *progress) step(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, "[%6.1fs] %s\n", time.Since(p.start).Seconds(), fmt.Sprintf(format, args...))
}

// toolOutput condenses a build tool's output: it keeps the last lines for an
// error message and reports a step only when the tool's current activity
// changes ("I: Retrieving libc6" then "I: Retrieving bash" is one step).
type toolOutput struct {
	mu       sync.Mutex
	p        *progress
	prefix   string
	partial  []byte
	tail     []string
	activity string
	count    int
}

// sameActivity folds verbs that alternate line by line into one activity:
// debootstrap retrieves and validates each package in turn.
var sameActivity = map[string]string{"Validating": "Retrieving"}

// tailLines is how much of a failed tool's output an error shows.
const tailLines = 25

func (o *toolOutput) Write(b []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.partial = append(o.partial, b...)
	for {
		i := bytes.IndexByte(o.partial, '\n')
		if i < 0 {
			break
		}
		o.line(strings.TrimRight(string(o.partial[:i]), "\r"))
		o.partial = o.partial[i+1:]
	}
	return len(b), nil
}

func (o *toolOutput) line(l string) {
	if strings.TrimSpace(l) == "" {
		return
	}
	o.tail = append(o.tail, l)
	if len(o.tail) > tailLines {
		o.tail = o.tail[len(o.tail)-tailLines:]
	}
	// debootstrap's own messages are "I: Verb object…"; everything else is
	// the chatter of dpkg and friends.
	msg, ok := strings.CutPrefix(l, "I: ")
	if !ok {
		return
	}
	verb, _, _ := strings.Cut(msg, " ")
	if alias, ok := sameActivity[verb]; ok {
		verb = alias
	}
	if verb == o.activity {
		o.count++
		return
	}
	o.flush()
	o.activity = verb
	o.count = 1
	o.p.step("%s: %s", o.prefix, strings.TrimSuffix(strings.TrimSpace(msg), "..."))
}

// flush reports how often the last activity repeated.
func (o *toolOutput) flush() {
	if o.count > 1 {
		o.p.step("%s: … %d× %s", o.prefix, o.count, strings.ToLower(o.activity))
	}
}

// Close reports the last activity's count.
func (o *toolOutput) Close() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.partial) > 0 {
		o.line(string(o.partial))
		o.partial = nil
	}
	o.flush()
	o.count = 0
}

// Tail returns the last lines of output.
func (o *toolOutput) Tail() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return strings.Join(o.tail, "\n")
}
