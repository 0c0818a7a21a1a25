package mcp

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlockhq/airlock/client"
)

// callTimeout bounds one tool call of the tests (a sandbox create on a
// loaded machine takes seconds; a first matplotlib import tens of them).
const callTimeout = 3 * time.Minute

// session is an MCP client session of the official Go SDK, with the
// tools' output schemas to check every structured result against (as
// the TypeScript client does).
type session struct {
	t       testing.TB
	cs      *sdk.ClientSession
	schemas map[string]*jsonschema.Resolved
}

// connectInMemory runs a Server for clientFor and connects a client to
// it over the in-memory transport.
func connectInMemory(t testing.TB, clientFor ClientFunc, opts Options) *session {
	t.Helper()
	ct, st := sdk.NewInMemoryTransports()
	srv := NewServer(clientFor, opts)
	ctx := context.Background()
	ss, err := srv.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ss.Close() })
	return connectClient(t, ct)
}

// staticClient is the ClientFunc of a stdio server: one client for all.
func staticClient(c *client.Client) ClientFunc {
	return func(context.Context, *sdk.CallToolRequest) (*client.Client, error) { return c, nil }
}

func connectClient(t testing.TB, tr sdk.Transport) *session {
	t.Helper()
	cl := sdk.NewClient(&sdk.Implementation{Name: "airlock-test", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	cs, err := cl.Connect(ctx, tr, nil)
	if err != nil {
		t.Fatalf("connecting the MCP client: %v", err)
	}
	t.Cleanup(func() { cs.Close() })
	s := &session{t: t, cs: cs, schemas: map[string]*jsonschema.Resolved{}}
	tools, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatalf("tools/list: %v", err)
	}
	for _, tool := range tools.Tools {
		if tool.OutputSchema == nil {
			continue
		}
		var sc jsonschema.Schema
		remarshal(t, tool.OutputSchema, &sc)
		r, err := sc.Resolve(nil)
		if err != nil {
			t.Fatalf("tool %s: output schema does not resolve: %v", tool.Name, err)
		}
		s.schemas[tool.Name] = r
	}
	return s
}

// call calls a tool; a protocol error fails the test (tool errors are
// results). A structured result must fit the tool's output schema.
func (s *session) call(name string, args map[string]any) *sdk.CallToolResult {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	res, err := s.cs.CallTool(ctx, &sdk.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		s.t.Fatalf("%s: protocol error: %v", name, err)
	}
	if res.StructuredContent != nil {
		r := s.schemas[name]
		if r == nil {
			s.t.Fatalf("%s: structured content but no output schema", name)
		}
		var v any
		remarshal(s.t, res.StructuredContent, &v)
		if err := r.Validate(v); err != nil {
			s.t.Fatalf("%s: structured content does not fit the output schema: %v\n%s", name, err, text(res))
		}
	} else if !res.IsError && s.schemas[name] != nil {
		s.t.Fatalf("%s: a result without structured content", name)
	}
	return res
}

// ok calls a tool that must succeed and decodes its structured result.
func (s *session) ok(name string, args map[string]any, out any) *sdk.CallToolResult {
	s.t.Helper()
	res := s.call(name, args)
	if res.IsError {
		s.t.Fatalf("%s(%v): tool error: %s", name, args, text(res))
	}
	if out != nil {
		remarshal(s.t, res.StructuredContent, out)
	}
	return res
}

// fails calls a tool that must fail and returns its error code and text.
func (s *session) fails(name string, args map[string]any) (code, msg string) {
	s.t.Helper()
	res := s.call(name, args)
	if !res.IsError {
		s.t.Fatalf("%s(%v): succeeded, want a tool error: %s", name, args, text(res))
	}
	if res.StructuredContent != nil {
		s.t.Fatalf("%s: an API error with structured content: %v", name, res.StructuredContent)
	}
	code, msg, found := strings.Cut(text(res), ": ")
	if !found {
		s.t.Fatalf("%s: tool error %q is not \"code: message\"", name, text(res))
	}
	return code, msg
}

// text is the text of a result's first content block.
func text(res *sdk.CallToolResult) string {
	for _, c := range res.Content {
		if tc, ok := c.(*sdk.TextContent); ok {
			return tc.Text
		}
	}
	return ""
}

// images are a result's image content blocks.
func images(res *sdk.CallToolResult) []*sdk.ImageContent {
	var out []*sdk.ImageContent
	for _, c := range res.Content {
		if ic, ok := c.(*sdk.ImageContent); ok {
			out = append(out, ic)
		}
	}
	return out
}

func remarshal(t testing.TB, in, out any) {
	t.Helper()
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, out); err != nil {
		t.Fatalf("decoding %s: %v", b, err)
	}
}

// bearerTransport adds an Authorization header to every request.
type bearerTransport struct {
	key  string
	base http.RoundTripper
}

func (b *bearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	if b.key != "" {
		r.Header.Set("Authorization", "Bearer "+b.key)
	}
	return b.base.RoundTrip(r)
}

// connectHTTP connects a client to the streamable HTTP endpoint at url
// with key as its bearer token.
func connectHTTP(t testing.TB, url, key string) *session {
	t.Helper()
	hc := &http.Client{Transport: &bearerTransport{key: key, base: http.DefaultTransport}}
	return connectClient(t, &sdk.StreamableClientTransport{Endpoint: url, HTTPClient: hc, MaxRetries: -1})
}
