package lint

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/airlockhq/airlock/"

// TestPlanesImports holds the first rule of the shape (issue 14, point 1):
// the planes (the HTTP API, the E2B planes, the code interpreter they
// serve) see the services' types, never the agent's wire protocol, its
// client or the store's records. A plane's tests may open a store to wire
// a manager (until the one daemon harness), nothing more.
func TestPlanesImports(t *testing.T) {
	planes := []string{"internal/plane/httpapi", "internal/plane/e2b", "internal/service/code"}
	banned := map[string]bool{ // in every file of a plane
		module + "internal/agentproto":  true,
		module + "internal/agentclient": true,
	}
	bannedOutsideTests := map[string]bool{
		module + "internal/store": true,
	}
	for _, dir := range planes {
		files, err := filepath.Glob(filepath.Join("..", "..", dir, "*.go"))
		if err != nil || len(files) == 0 {
			t.Fatalf("%s: no Go files (%v)", dir, err)
		}
		for _, f := range files {
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			af, err := parser.ParseFile(token.NewFileSet(), f, src, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			test := strings.HasSuffix(f, "_test.go")
			for _, im := range af.Imports {
				p, _ := strconv.Unquote(im.Path.Value)
				if banned[p] || (!test && bannedOutsideTests[p]) {
					t.Errorf("%s imports %s: a plane uses the manager's types (internal/service/…), not the agent's or the store's", filepath.Join(dir, filepath.Base(f)), strings.TrimPrefix(p, module))
				}
			}
		}
	}
}
