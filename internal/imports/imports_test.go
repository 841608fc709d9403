package imports

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/exo-pd/exo-pd/"

// rule: no file under from imports a package under to (except, for cmd/,
// files under cmd/ itself).
var rules = []struct{ from, to string }{
	{"supervisor/", "runners/"},
	{"runners/", "supervisor/"},
	{"", "cmd/"},
	// the protocol-neutral generation API stands on the standard library
	// alone
	{"runners/gen/", ""},
	// the decode runner is a gen.Generator: the HTTP adapters over it are
	// composed by runners/httpapi, which knows no generator
	{"runners/decode/", "runners/anthropic/"},
	{"runners/httpapi/", "runners/decode/"},
	// the supervisor reads model facts through internal/modelinfo, so it
	// stands on the standard library too (its tests may use runners/ to
	// make and cross-check models)
	{"internal/modelinfo/", "runners/"},
	// test support: only tests serve a KV producer the test's way
	{"", "runners/kvwire/kvwiretest/"},
}

func TestImportRules(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	files := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); path != root && (strings.HasPrefix(n, ".") || n == "testdata" || n == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			t.Errorf("%s: %v", rel, err)
			return nil
		}
		files++
		for _, im := range f.Imports {
			p, _ := strconv.Unquote(im.Path.Value)
			dep, ok := strings.CutPrefix(p, module)
			if !ok {
				continue
			}
			dep += "/"
			for _, r := range rules {
				if !strings.HasPrefix(rel, r.from) || !strings.HasPrefix(dep, r.to) {
					continue
				}
				if r.to == "cmd/" && strings.HasPrefix(rel, "cmd/") {
					continue
				}
				if (r.from == "internal/modelinfo/" || r.to == "runners/kvwire/kvwiretest/") && strings.HasSuffix(rel, "_test.go") {
					continue
				}
				t.Errorf("%s imports %s: %s must not import %s", rel, p, or(r.from, "code outside cmd/"), r.to)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 100 {
		t.Fatalf("walked only %d Go files from %s: not the module root?", files, root)
	}
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
