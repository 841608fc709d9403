package hf

import (
	"path/filepath"
	"strings"
	"testing"
)

// FuzzParseRef: model ids come from users and cluster files. Parsing never
// panics; what it accepts stays inside the store (no "..", no absolute
// path, no control character, only .gguf files named; the store's paths
// for it are under the store) and prints back to the same Ref.
func FuzzParseRef(f *testing.F) {
	for _, s := range []string{"Qwen/Qwen3-8B", "org/m@v1", "org/m/sub/x.gguf@refs/pr/1", "a/../b", "/etc/passwd", "org/name@", "x", "org/m/a.GGUF",
		"org/m@../../etc", "org/m\x00/x.gguf", "org/m@refs/../..", "..%2f/m", "org/m\n@v1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseRef(s)
		if err != nil {
			return
		}
		for _, p := range strings.Split(r.Repo+"/"+r.File, "/") {
			if p == ".." || p == "." {
				t.Fatalf("%q: accepted path element %q", s, p)
			}
		}
		if strings.Contains(r.Revision, "..") || strings.HasPrefix(r.Repo, "/") {
			t.Fatalf("%q: accepted %+v", s, r)
		}
		if r.File != "" && !strings.HasSuffix(strings.ToLower(r.File), ".gguf") {
			t.Fatalf("%q: accepted non-GGUF file %q", s, r.File)
		}
		if r.File != "" {
			if err := safeName(r.File); err != nil {
				t.Fatalf("%q: ParseRef accepted a file safeName refuses: %v", s, err)
			}
		}
		for _, c := range s {
			if c < 0x20 || c == 0x7f {
				t.Fatalf("%q: accepted a control character", s)
			}
		}
		st := store{dir: "/store"}
		for _, p := range []string{st.repoDir(r.Repo), st.refPath(r.Repo, r.Revision), st.snapshotDir(r.Repo, strings.Repeat("a", 40))} {
			if c := filepath.Clean(p); !strings.HasPrefix(c, "/store/") || c != p {
				t.Fatalf("%q: store path %q leaves the store (or is not clean)", s, p)
			}
		}
		r2, err := ParseRef(r.String())
		if err != nil || r2 != r {
			t.Fatalf("%q → %+v → %q → %+v, %v", s, r, r.String(), r2, err)
		}
	})
}
