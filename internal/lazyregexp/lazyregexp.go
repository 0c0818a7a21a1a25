// Package lazyregexp is a regular expression compiled on first use.
//
// A package-level regexp.MustCompile runs when the program starts, in every
// command of the one airlock binary: the daemon's validation patterns (with
// counted repeats such as {0,255}, which the compiler unrolls) cost the CLI
// a few milliseconds and hundreds of kilobytes before its first request.
// A *Regexp declared with New costs nothing until it matches.
package lazyregexp

import (
	"regexp"
	"sync"
)

// Regexp is a regexp.Regexp compiled the first time it is used. It is safe
// for concurrent use, as regexp.Regexp is.
type Regexp struct {
	expr string
	once sync.Once
	re   *regexp.Regexp
}

// New returns expr, to be compiled on first use; a bad expression panics
// then, as regexp.MustCompile would at start (Compile checks it eagerly,
// for tests).
func New(expr string) *Regexp { return &Regexp{expr: expr} }

// Regexp returns the compiled expression.
func (r *Regexp) Regexp() *regexp.Regexp {
	r.once.Do(func() { r.re = regexp.MustCompile(r.expr) })
	return r.re
}

// Compile compiles the expression now and reports whether it is valid.
func (r *Regexp) Compile() error {
	_, err := regexp.Compile(r.expr)
	return err
}

// String returns the source text of the expression.
func (r *Regexp) String() string { return r.expr }

// MatchString is regexp.Regexp.MatchString.
func (r *Regexp) MatchString(s string) bool { return r.Regexp().MatchString(s) }

// Match is regexp.Regexp.Match.
func (r *Regexp) Match(b []byte) bool { return r.Regexp().Match(b) }

// FindStringSubmatch is regexp.Regexp.FindStringSubmatch.
func (r *Regexp) FindStringSubmatch(s string) []string { return r.Regexp().FindStringSubmatch(s) }

// FindSubmatch is regexp.Regexp.FindSubmatch.
func (r *Regexp) FindSubmatch(b []byte) [][]byte { return r.Regexp().FindSubmatch(b) }
