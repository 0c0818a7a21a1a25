package lint

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPackageDocs asserts that every package in the module has exactly one
// `// Package x …` comment, as STYLE.md asks (after Tailscale's pkgdoc_test).
func TestPackageDocs(t *testing.T) {
	root := filepath.Join("..", "..")
	dirs := map[string][]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if p != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "bin" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(p, ".go") && !strings.HasSuffix(p, "_test.go") {
			dirs[filepath.Dir(p)] = append(dirs[filepath.Dir(p)], p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for dir, files := range dirs {
		var withDoc []string
		var pkg string
		for _, f := range files {
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			af, err := parser.ParseFile(token.NewFileSet(), f, src, parser.PackageClauseOnly|parser.ParseComments)
			if err != nil {
				t.Fatal(err)
			}
			pkg = af.Name.Name
			if af.Doc != nil {
				withDoc = append(withDoc, f)
				text := af.Doc.Text()
				if pkg != "main" && !strings.HasPrefix(text, "Package "+pkg+" ") {
					t.Errorf("%s: package doc should start with %q", f, "Package "+pkg+" ")
				}
			}
		}
		switch {
		case len(withDoc) == 0:
			t.Errorf("%s: package %s has no package doc comment", dir, pkg)
		case len(withDoc) > 1:
			t.Errorf("%s: package doc in more than one file: %v", dir, withDoc)
		}
	}
}
