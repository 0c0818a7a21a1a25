package client

import (
	"fmt"
	"strings"
)

// A tiny YAML reader for api/openapi.yaml, so the spec test needs no YAML
// dependency. It reads the subset the spec is written in: block mappings and
// sequences, plain and quoted scalars, flow sequences of scalars ([a, "b"]),
// empty flow collections, folded/literal block scalars, and whole-line
// comments. Anything else is an error, which keeps the spec in that subset.

type yline struct {
	n      int // 1-based line number
	indent int
	text   string // without indentation
}

type yparser struct {
	lines []yline
	pos   int
}

func parseYAML(src string) (any, error) {
	p := &yparser{}
	for i, raw := range strings.Split(src, "\n") {
		if strings.Contains(raw, "\t") {
			return nil, fmt.Errorf("line %d: tab", i+1)
		}
		t := strings.TrimRight(raw, " \r")
		trim := strings.TrimLeft(t, " ")
		if trim == "" || strings.HasPrefix(trim, "#") {
			// Blank and comment lines; block scalars re-read raw lines below.
			p.lines = append(p.lines, yline{n: i + 1, indent: -1, text: ""})
			continue
		}
		p.lines = append(p.lines, yline{n: i + 1, indent: len(t) - len(trim), text: trim})
	}
	p.skipBlank()
	if p.pos >= len(p.lines) {
		return nil, nil
	}
	v, err := p.node(p.lines[p.pos].indent)
	if err != nil {
		return nil, err
	}
	p.skipBlank()
	if p.pos < len(p.lines) {
		l := p.lines[p.pos]
		return nil, fmt.Errorf("line %d: unexpected indentation", l.n)
	}
	return v, nil
}

func (p *yparser) skipBlank() {
	for p.pos < len(p.lines) && p.lines[p.pos].indent < 0 {
		p.pos++
	}
}

// node parses the block (mapping or sequence) whose lines start at indent.
func (p *yparser) node(indent int) (any, error) {
	p.skipBlank()
	if strings.HasPrefix(p.lines[p.pos].text, "- ") || p.lines[p.pos].text == "-" {
		return p.seq(indent)
	}
	return p.mapping(indent)
}

func (p *yparser) seq(indent int) ([]any, error) {
	var out []any
	for {
		p.skipBlank()
		if p.pos >= len(p.lines) || p.lines[p.pos].indent < indent {
			return out, nil
		}
		l := p.lines[p.pos]
		if l.indent != indent || !strings.HasPrefix(l.text, "- ") {
			return nil, fmt.Errorf("line %d: expected a sequence item", l.n)
		}
		item := strings.TrimPrefix(l.text, "- ")
		if k, _, ok := splitKey(item); ok && k != "" {
			// "- key: value" starts a mapping indented two past the dash.
			p.lines[p.pos] = yline{n: l.n, indent: indent + 2, text: item}
			m, err := p.mapping(indent + 2)
			if err != nil {
				return nil, err
			}
			out = append(out, m)
			continue
		}
		p.pos++
		v, err := scalar(item, l.n)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
}

func (p *yparser) mapping(indent int) (map[string]any, error) {
	out := map[string]any{}
	for {
		p.skipBlank()
		if p.pos >= len(p.lines) || p.lines[p.pos].indent < indent {
			return out, nil
		}
		l := p.lines[p.pos]
		if l.indent != indent {
			return nil, fmt.Errorf("line %d: bad indentation %d, want %d", l.n, l.indent, indent)
		}
		k, rest, ok := splitKey(l.text)
		if !ok {
			return nil, fmt.Errorf("line %d: expected key: value", l.n)
		}
		if _, dup := out[k]; dup {
			return nil, fmt.Errorf("line %d: duplicate key %q", l.n, k)
		}
		p.pos++
		switch {
		case rest == "":
			p.skipBlank()
			if p.pos < len(p.lines) && p.lines[p.pos].indent > indent {
				v, err := p.node(p.lines[p.pos].indent)
				if err != nil {
					return nil, err
				}
				out[k] = v
			} else if p.pos < len(p.lines) && p.lines[p.pos].indent == indent && strings.HasPrefix(p.lines[p.pos].text, "- ") {
				v, err := p.seq(indent) // a sequence may sit at its key's indentation
				if err != nil {
					return nil, err
				}
				out[k] = v
			} else {
				out[k] = nil
			}
		case rest == ">" || rest == ">-" || rest == "|" || rest == "|-":
			out[k] = p.blockScalar(indent, rest[0] == '>')
		default:
			v, err := scalar(rest, l.n)
			if err != nil {
				return nil, err
			}
			out[k] = v
		}
	}
}

// blockScalar reads the lines indented past indent as one string.
func (p *yparser) blockScalar(indent int, folded bool) string {
	var parts []string
	for p.pos < len(p.lines) {
		l := p.lines[p.pos]
		if l.indent >= 0 && l.indent <= indent {
			break
		}
		parts = append(parts, l.text)
		p.pos++
	}
	sep := "\n"
	if folded {
		sep = " "
	}
	return strings.TrimSpace(strings.Join(parts, sep))
}

// splitKey splits "key: value" (or "key:") outside quotes.
func splitKey(s string) (key, rest string, ok bool) {
	if strings.HasPrefix(s, `"`) || strings.HasPrefix(s, `'`) {
		q := s[0]
		end := strings.IndexByte(s[1:], q)
		if end < 0 {
			return "", "", false
		}
		key, s = s[1:end+1], s[end+2:]
		if !strings.HasPrefix(s, ":") {
			return "", "", false
		}
		return key, strings.TrimSpace(s[1:]), true
	}
	if i := strings.Index(s, ": "); i >= 0 {
		return s[:i], strings.TrimSpace(s[i+2:]), true
	}
	if strings.HasSuffix(s, ":") {
		return s[:len(s)-1], "", true
	}
	return "", "", false
}

func scalar(s string, n int) (any, error) {
	switch {
	case s == "[]":
		return []any{}, nil
	case s == "{}":
		return map[string]any{}, nil
	case strings.HasPrefix(s, "["):
		if !strings.HasSuffix(s, "]") {
			return nil, fmt.Errorf("line %d: unterminated flow sequence", n)
		}
		var out []any
		for _, part := range strings.Split(s[1:len(s)-1], ",") {
			v, err := scalar(strings.TrimSpace(part), n)
			if err != nil {
				return nil, err
			}
			if _, isColl := v.([]any); isColl {
				return nil, fmt.Errorf("line %d: nested flow collection", n)
			}
			out = append(out, v)
		}
		return out, nil
	case strings.HasPrefix(s, "{"):
		return nil, fmt.Errorf("line %d: flow mappings are not in the subset", n)
	case strings.HasPrefix(s, `"`):
		if len(s) < 2 || !strings.HasSuffix(s, `"`) {
			return nil, fmt.Errorf("line %d: unterminated string", n)
		}
		return strings.ReplaceAll(s[1:len(s)-1], `\"`, `"`), nil
	case strings.HasPrefix(s, `'`):
		if len(s) < 2 || !strings.HasSuffix(s, `'`) {
			return nil, fmt.Errorf("line %d: unterminated string", n)
		}
		return strings.ReplaceAll(s[1:len(s)-1], `''`, `'`), nil
	case strings.Contains(s, " #"):
		return nil, fmt.Errorf("line %d: trailing comment or '#' in a plain scalar; quote it", n)
	case strings.Contains(s, ": "):
		return nil, fmt.Errorf("line %d: ': ' in a plain scalar; quote it", n)
	}
	return s, nil
}
