package sandbox

import (
	"strings"
	"unicode/utf8"

	"github.com/airlockhq/airlock/internal/lazyregexp"
)

// userRE is what a user name in a request must be.
var userRE = lazyregexp.New(`^[a-z_][a-z0-9_-]{0,31}$`)

// AgentText makes a text the agent sent fit for a record or an error
// message: valid UTF-8 without control characters, at most n bytes. What
// the agent says is the sandbox's to forge.
func AgentText(s string, n int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}
