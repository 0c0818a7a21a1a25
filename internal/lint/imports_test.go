package lint

import (
	"fmt"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// module is the import path prefix of airlock's packages (the root module
// and the api/ and client/ modules beside it).
const module = "github.com/airlockhq/airlock/"

// The shape of the tree (docs/architecture.md, "Rules of the shape"), held
// as rules over the imports of every Go file:
//
//	planes (internal/plane/…) → services (internal/service/…) → drivers, the
//	store and the other mechanisms (internal/…)
//
// A pattern names a package of the repository by its path from the root
// ("internal/service/sandbox"), a tree ("internal/plane/...": it and every
// package below it), the packages below one ("internal/driver/*": below it,
// not it), or a package outside it by its import path ("net/http",
// "net/http/...").
type rule struct {
	// name says the rule in a few words; why, in the failure, what to do.
	name, why string
	// from are the packages the rule holds for, but those of except.
	from, except []string
	// tests: the rule holds for _test.go files too.
	tests bool
	// allow, when set, are the only repository packages they may import
	// (packages outside the repository are not limited by it).
	allow []string
	// deny are packages they must not import.
	deny []string
}

// edge is leaf layers' shared helpers that a plane may use: API types,
// principals, the audit recorder (authentication failures), the error
// classes and their one table, tracing, the configuration.
var edge = []string{"api", "internal/auth", "internal/audit", "internal/errdefs/...", "internal/tracing",
	"internal/config", "internal/version", "internal/lazyregexp"}

// rules is the shape.
var rules = []rule{
	{
		name: "a plane uses services, never the agent, a driver or the store",
		why:  "a plane decodes, authenticates, calls a service through an interface of its own, encodes; what it needs of a sandbox is a service's (internal/service/…)",
		from: []string{"internal/plane/..."}, except: []string{"internal/plane/mcp"},
		allow: append([]string{"internal/plane/...", "internal/service/..."}, edge...),
		deny:  []string{"internal/service", "internal/service/servicetest"},
	},
	{
		name:  "no file of a plane, its tests included, sees the agent's wire",
		why:   "the agent protocol stays below the services: use the exec and file services' types",
		from:  []string{"internal/plane/..."},
		tests: true,
		deny:  []string{"internal/agentproto", "internal/agentclient"},
	},
	{
		name:  "the MCP plane is a client of the API",
		why:   "it runs beside the user's agent and talks to a daemon through the Go SDK",
		from:  []string{"internal/plane/mcp"},
		allow: []string{"api", "client/...", "internal/plane/mcp/...", "internal/version", "internal/lazyregexp"},
	},
	{
		name: "a service never sees HTTP or a plane",
		why:  "services take and return API and service types; the planes do HTTP (an HTTP listener is a plane: internal/plane/…)",
		from: []string{"internal/service/..."},
		deny: []string{"internal/plane/...", "net/http", "net/http/...", "internal/daemon", "internal/cli", "client/..."},
	},
	{
		name:   "a service uses the sandbox lifecycle, no other service",
		why:    "what a service needs of another is given to it at construction as an interface (internal/service wires them)",
		from:   []string{"internal/service/..."},
		except: []string{"internal/service", "internal/service/servicetest", "internal/service/sandbox"},
		deny:   []string{"internal/service", "internal/service/accounting", "internal/service/code", "internal/service/exec", "internal/service/files", "internal/service/netpolicy", "internal/service/previews", "internal/service/templates", "internal/service/servicetest"},
	},
	{
		name: "the sandbox lifecycle uses no other service",
		why:  "it is the services' common base: what it needs of the others (policies, the exec engine, previews, the meter) is declared in its Config as interfaces",
		from: []string{"internal/service/sandbox"},
		deny: []string{"internal/service", "internal/service/..."},
	},
	{
		name:   "a service uses drivers through the driver interface",
		why:    "the daemon chooses the drivers; services see driver.Driver and its optional interfaces",
		from:   []string{"internal/service/..."},
		except: []string{"internal/service/servicetest"},
		deny:   []string{"internal/driver/*"},
	},
	{
		name: "a driver never imports a service or a plane",
		why:  "drivers are below the services: they run sandboxes and know nothing of tenants, execs or HTTP",
		from: []string{"internal/driver/..."},
		deny: []string{"internal/service", "internal/service/...", "internal/plane/...", "internal/daemon", "internal/cli"},
	},
	{
		name: "a mechanism never imports a service or a plane",
		why:  "the store, the network, storage, builds and the other mechanisms are below the services",
		from: []string{"internal/..."},
		except: []string{"internal/plane/...", "internal/service", "internal/service/...", "internal/daemon", "internal/cli",
			"internal/testutil/...", "internal/lint", "internal/bench"},
		deny: []string{"internal/service", "internal/service/...", "internal/plane/...", "internal/daemon", "internal/cli"},
	},
	{
		name:  "agent code never imports host code",
		why:   "airlock-agent runs inside every sandbox: it links its wire protocol and nothing of the daemon",
		from:  []string{"internal/agent/...", "cmd/airlock-agent"},
		allow: []string{"internal/agent/...", "internal/agentproto"},
	},
	{
		name:  "the SDK and the API types import nothing internal",
		why:   "client/ and api/ are modules of their own that users go get",
		from:  []string{"client/...", "api/..."},
		tests: true,
		deny:  []string{"internal/..."},
	},
	{
		name:  "the CLI is a client of the API",
		why:   "its client commands start without daemon parts; `airlock serve` is handed to it by cmd/airlock",
		from:  []string{"internal/cli/..."},
		allow: []string{"api", "client/...", "internal/cli/...", "internal/plane/mcp/...", "internal/version", "internal/lazyregexp", "internal/hostslot"},
	},
	{
		name:  "cmd/airlock is a thin main",
		why:   "the CLI and the daemon are packages of their own",
		from:  []string{"cmd/airlock"},
		allow: []string{"internal/cli", "internal/daemon"},
	},
}

// match reports whether package path p (from the repository's root, or an
// import path outside it) is named by pattern.
func match(pattern, p string) bool {
	if parent, ok := strings.CutSuffix(pattern, "/*"); ok {
		return strings.HasPrefix(p, parent+"/")
	}
	if tree, ok := strings.CutSuffix(pattern, "/..."); ok {
		return p == tree || strings.HasPrefix(p, tree+"/")
	}
	return p == pattern
}

func matchAny(patterns []string, p string) bool {
	return slices.ContainsFunc(patterns, func(pat string) bool { return match(pat, p) })
}

// pkg is one package directory's imports, apart for its _test.go files.
type pkg struct {
	imports, testImports map[string]bool
}

// violation is one import a rule forbids.
type violation struct {
	rule     string
	from, to string
	test     bool
}

func (v violation) String() string {
	kind := ""
	if v.test {
		kind = " (in a test)"
	}
	return fmt.Sprintf("%s imports %s%s", v.from, v.to, kind)
}

// inRepo turns an import path into a package path from the repository's
// root, ok false for packages outside it.
func inRepo(imp string) (string, bool) {
	return strings.CutPrefix(imp, module)
}

// check returns every violation of rules in graph (package path from the
// root → its imports, as import paths).
func check(graph map[string]pkg, rules []rule) []violation {
	var out []violation
	paths := make([]string, 0, len(graph))
	for p := range graph {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	for _, r := range rules {
		for _, from := range paths {
			if !matchAny(r.from, from) || matchAny(r.except, from) {
				continue
			}
			g := graph[from]
			sets := []struct {
				imports map[string]bool
				test    bool
			}{{g.imports, false}}
			if r.tests {
				sets = append(sets, struct {
					imports map[string]bool
					test    bool
				}{g.testImports, true})
			}
			for _, s := range sets {
				imps := make([]string, 0, len(s.imports))
				for imp := range s.imports {
					imps = append(imps, imp)
				}
				slices.Sort(imps)
				for _, imp := range imps {
					to, repo := inRepo(imp)
					if !repo {
						to = imp
					}
					bad := matchAny(r.deny, to)
					if r.allow != nil && repo && !matchAny(r.allow, to) {
						bad = true
					}
					if bad {
						out = append(out, violation{rule: r.name, from: from, to: to, test: s.test})
					}
				}
			}
		}
	}
	return out
}

// importGraph reads the imports of every Go file under root.
func importGraph(t *testing.T, root string) map[string]pkg {
	t.Helper()
	graph := map[string]pkg{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if p != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules" || name == "bin") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") {
			return nil
		}
		src, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		af, err := parser.ParseFile(token.NewFileSet(), p, src, parser.ImportsOnly)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, filepath.Dir(p))
		if err != nil {
			return err
		}
		dir := filepath.ToSlash(rel)
		g, ok := graph[dir]
		if !ok {
			g = pkg{imports: map[string]bool{}, testImports: map[string]bool{}}
			graph[dir] = g
		}
		set := g.imports
		if strings.HasSuffix(p, "_test.go") {
			set = g.testImports
		}
		for _, im := range af.Imports {
			ip, _ := strconv.Unquote(im.Path.Value)
			set[ip] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return graph
}

// TestImportRules holds the shape on the tree: it fails on any import a
// rule forbids.
func TestImportRules(t *testing.T) {
	root := filepath.Join("..", "..")
	graph := importGraph(t, root)
	// The rules are about packages that exist: a rule whose packages all
	// moved away would hold nothing.
	for _, r := range rules {
		if !slices.ContainsFunc(mapsKeys(graph), func(p string) bool { return matchAny(r.from, p) }) && !slices.Contains(r.from, "internal/plane/mcp") {
			t.Errorf("rule %q holds for no package of the tree (%v)", r.name, r.from)
		}
	}
	why := map[string]string{}
	for _, r := range rules {
		why[r.name] = r.why
	}
	for _, v := range check(graph, rules) {
		t.Errorf("%s: %s — %s", v.rule, v, why[v.rule])
	}
}

func mapsKeys(m map[string]pkg) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestImportRulesCatchViolations runs the checker on an import graph made
// up for it: each forbidden import is reported by its rule, and a graph of
// the shape as it should be passes.
func TestImportRulesCatchViolations(t *testing.T) {
	imp := func(paths ...string) map[string]bool {
		out := map[string]bool{}
		for _, p := range paths {
			for _, top := range []string{"internal/", "cmd/", "api", "client"} {
				if strings.HasPrefix(p, top) {
					p = module + p
					break
				}
			}
			out[p] = true
		}
		return out
	}
	clean := map[string]pkg{
		"internal/plane/httpapi":    {imports: imp("api", "internal/service/exec", "internal/auth", "net/http"), testImports: imp("internal/store", "internal/service")},
		"internal/plane/mcp":        {imports: imp("client", "api")},
		"internal/service/exec":     {imports: imp("internal/service/sandbox", "internal/agentclient", "internal/store", "internal/driver")},
		"internal/service/sandbox":  {imports: imp("internal/driver", "internal/store", "internal/agentclient")},
		"internal/service":          {imports: imp("internal/service/exec", "internal/service/sandbox")},
		"internal/driver/runc":      {imports: imp("internal/driver", "internal/driver/oci")},
		"internal/store":            {imports: imp("internal/errdefs")},
		"internal/agent":            {imports: imp("internal/agentproto")},
		"cmd/airlock-agent":         {imports: imp("internal/agent")},
		"client":                    {imports: imp("api"), testImports: imp("api")},
		"internal/cli":              {imports: imp("client", "api", "internal/plane/mcp")},
		"cmd/airlock":               {imports: imp("internal/cli", "internal/daemon")},
		"internal/daemon":           {imports: imp("internal/service", "internal/plane/httpapi", "internal/driver/runc")},
		"internal/service/previews": {imports: imp("internal/service/sandbox", "net")},
	}
	if vs := check(clean, rules); len(vs) != 0 {
		t.Fatalf("the shape as it should be has violations: %v", vs)
	}
	tests := []struct {
		name     string
		from     string
		p        pkg
		wantRule string
	}{
		{"plane-store", "internal/plane/httpapi", pkg{imports: imp("internal/store")}, rules[0].name},
		{"plane-driver", "internal/plane/e2b", pkg{imports: imp("internal/driver/runc")}, rules[0].name},
		{"plane-wiring", "internal/plane/httpapi", pkg{imports: imp("internal/service")}, rules[0].name},
		{"plane-test-agentproto", "internal/plane/httpapi", pkg{testImports: imp("internal/agentproto")}, rules[1].name},
		{"mcp-service", "internal/plane/mcp", pkg{imports: imp("internal/service/exec")}, rules[2].name},
		{"service-http", "internal/service/files", pkg{imports: imp("net/http")}, rules[3].name},
		{"service-plane", "internal/service/exec", pkg{imports: imp("internal/plane/preview")}, rules[3].name},
		{"service-service", "internal/service/files", pkg{imports: imp("internal/service/exec")}, rules[4].name},
		{"core-service", "internal/service/sandbox", pkg{imports: imp("internal/service/exec")}, rules[5].name},
		{"service-concrete-driver", "internal/service/exec", pkg{imports: imp("internal/driver/runc")}, rules[6].name},
		{"driver-service", "internal/driver/oci", pkg{imports: imp("internal/service/sandbox")}, rules[7].name},
		{"mechanism-plane", "internal/network", pkg{imports: imp("internal/plane/httpapi")}, rules[8].name},
		{"agent-host", "internal/agent", pkg{imports: imp("internal/store")}, rules[9].name},
		{"agent-main-host", "cmd/airlock-agent", pkg{imports: imp("internal/agentclient")}, rules[9].name},
		{"sdk-internal", "client", pkg{testImports: imp("internal/errdefs")}, rules[10].name},
		{"api-internal", "api", pkg{imports: imp("internal/errdefs")}, rules[10].name},
		{"cli-daemon", "internal/cli", pkg{imports: imp("internal/daemon")}, rules[11].name},
		{"main-fat", "cmd/airlock", pkg{imports: imp("internal/store")}, rules[12].name},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.p.imports == nil {
				tt.p.imports = map[string]bool{}
			}
			if tt.p.testImports == nil {
				tt.p.testImports = map[string]bool{}
			}
			vs := check(map[string]pkg{tt.from: tt.p}, rules)
			found := false
			for _, v := range vs {
				found = found || v.rule == tt.wantRule
			}
			if !found {
				t.Fatalf("%s %v: not reported by %q (got %v)", tt.from, tt.p, tt.wantRule, vs)
			}
		})
	}
}
