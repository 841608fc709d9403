// Package hf owns model sources for the runners: it resolves a `--model`
// value (a local directory, a .gguf file, "builtin:smollm2", or a Hugging
// Face id "org/name[@rev]") to a local path, and keeps the local model store
// that Hugging Face repositories are pulled into (parallel ranged downloads,
// resume, size and checksum verification, atomic placement, a cross-process
// lock, offline mode).
//
// It must not touch model weights beyond placing files (parsing belongs to
// runners/engine/weights) and must not import supervisor/ or other runners.
package hf

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// Options configure Resolve and Pull. The zero value reads everything from
// the environment.
type Options struct {
	// StoreDir is the model store; empty means $EXO_MODELS_DIR, else
	// $STATE_DIRECTORY/models (under systemd), else ~/.cache/exo/models.
	StoreDir string
	// Offline uses only the store (also when HF_HUB_OFFLINE=1).
	Offline bool
	// Token is sent as "Authorization: Bearer" to the endpoint (never to
	// other hosts); empty means $HF_TOKEN.
	Token string
	// Endpoint is the Hub's base URL; empty means $HF_ENDPOINT, else
	// https://huggingface.co.
	Endpoint string
	// Progress, when set, is called with bytes done and total bytes of the
	// files being pulled. Calls come from one goroutine at a time.
	Progress func(done, total int64)
	// Logger receives download progress lines; nil means slog.Default().
	Logger *slog.Logger
	// Plan, when set, is called once before any weights are fetched with
	// the store directory, the bytes still to download (what is already
	// there, whole or partial, not counted) and the bytes free on its
	// filesystem (-1: unknown). A pull that does not fit then fails with
	// ErrNoSpace before downloading.
	Plan func(dir string, need, free int64)
	// Layers, when not zero, pulls only what a pipeline stage of those
	// layers needs from a sharded safetensors repository: the files the
	// shard index assigns to its layers (with the embedding for the first
	// layer, the final norm and LM head for the last, and the embedding
	// again for a last stage whose head is tied to it) and the config and
	// tokenizer files. A repository without a shard index, or a named
	// GGUF file, is fetched whole (split GGUFs are not supported). Such a
	// partial snapshot serves that stage (and any whose files it holds),
	// never a whole-model Resolve.
	Layers LayerRange
}

// Errors callers may branch on (with errors.Is).
var (
	// ErrNotFound: the repository, revision or file does not exist (HTTP 404).
	ErrNotFound = errors.New("hf: not found")
	// ErrUnauthorized: HTTP 401/403. The Hub answers 401 for gated and
	// private repositories without a valid token, and also for ones that do
	// not exist.
	ErrUnauthorized = errors.New("hf: unauthorized (gated or private repository, or no such repository; for gated ones accept the terms on its page and set HF_TOKEN)")
	// ErrNotInStore: offline mode and the model is not in the store.
	ErrNotInStore = errors.New("hf: model not in the local store")
	// ErrNoSpace: the store's filesystem cannot hold the model.
	ErrNoSpace = errors.New("not enough free disk space for the model")
	// ErrChecksum: a downloaded file did not match its size or hash, even after re-fetching.
	ErrChecksum = errors.New("hf: checksum mismatch")
)

const defaultEndpoint = "https://huggingface.co"

// StoreDir returns the store directory the options select.
func (o Options) storeDir() (string, error) {
	if o.StoreDir != "" {
		return o.StoreDir, nil
	}
	if d := os.Getenv("EXO_MODELS_DIR"); d != "" {
		return d, nil
	}
	if d := os.Getenv("STATE_DIRECTORY"); d != "" {
		// systemd may list several directories separated by ':'.
		first, _, _ := strings.Cut(d, ":")
		return filepath.Join(first, "models"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("hf: no store directory (set EXO_MODELS_DIR): %w", err)
	}
	return filepath.Join(home, ".cache", "exo", "models"), nil
}

// StoreDir returns the model store directory selected by o and the environment.
func StoreDir(o Options) (string, error) { return o.storeDir() }

func (o Options) offline() bool {
	if o.Offline {
		return true
	}
	v := strings.ToLower(os.Getenv("HF_HUB_OFFLINE"))
	return v == "1" || v == "true" || v == "yes"
}

func (o Options) token() string {
	if o.Token != "" {
		return o.Token
	}
	if t := os.Getenv("HF_TOKEN"); t != "" {
		return t
	}
	return os.Getenv("HUGGING_FACE_HUB_TOKEN")
}

func (o Options) endpoint() string {
	e := o.Endpoint
	if e == "" {
		e = os.Getenv("HF_ENDPOINT")
	}
	if e == "" {
		e = defaultEndpoint
	}
	return strings.TrimRight(e, "/")
}

func (o Options) logger() *slog.Logger {
	if o.Logger != nil {
		return o.Logger
	}
	return slog.Default()
}

// Ref names a model on the Hub: a repository, a revision (branch, tag or
// commit; "main" when omitted) and optionally one file (a .gguf) inside it.
type Ref struct {
	Repo     string // "org/name"
	Revision string // "main" unless given
	File     string // "" for a safetensors model; "path/x.gguf" for one GGUF file
}

// LogValue logs a Ref as the id a user would type.
func (r Ref) LogValue() slog.Value { return slog.StringValue(r.String()) }

func (r Ref) String() string {
	s := r.Repo
	if r.File != "" {
		s += "/" + r.File
	}
	if r.Revision != "" && r.Revision != "main" {
		s += "@" + r.Revision
	}
	return s
}

var (
	repoPart = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)
	revPart  = regexp.MustCompile(`^[A-Za-z0-9._/-]+$`)
)

// ParseRef parses "org/name[@rev]" or "org/name/file.gguf[@rev]".
func ParseRef(s string) (Ref, error) {
	id, rev, hasRev := strings.Cut(s, "@")
	if hasRev && (rev == "" || !revPart.MatchString(rev) || strings.Contains(rev, "..")) {
		return Ref{}, fmt.Errorf("hf: bad revision in %q", s)
	}
	if !hasRev {
		rev = "main"
	}
	parts := strings.Split(id, "/")
	if len(parts) < 2 {
		return Ref{}, fmt.Errorf("hf: %q is not a Hugging Face id (want org/name[@rev])", s)
	}
	for _, p := range parts {
		if !repoPart.MatchString(p) || p == "." || p == ".." {
			return Ref{}, fmt.Errorf("hf: bad path element %q in %q", p, s)
		}
	}
	r := Ref{Repo: parts[0] + "/" + parts[1], Revision: rev}
	if len(parts) > 2 {
		r.File = strings.Join(parts[2:], "/")
		if !strings.HasSuffix(strings.ToLower(r.File), ".gguf") {
			return Ref{}, fmt.Errorf("hf: %q: only a .gguf file may be named inside a repository", s)
		}
	}
	return r, nil
}

// Resolve turns a model source into a local path: a model directory or a
// .gguf file. Sources: an existing local directory or .gguf file;
// "builtin:smollm2"; or a Hugging Face id "org/name[@rev]" (or
// "org/name/file.gguf[@rev]"), which is taken from the store when present
// and otherwise pulled (unless offline).
func Resolve(ctx context.Context, source string, o Options) (string, error) {
	if source == "" {
		return "", errors.New("hf: empty model source")
	}
	if name, ok := strings.CutPrefix(source, "builtin:"); ok {
		return builtin(ctx, name)
	}
	if st, err := os.Stat(source); err == nil {
		abs, err := filepath.Abs(source)
		if err != nil {
			return "", fmt.Errorf("hf: %w", err)
		}
		if st.IsDir() || strings.HasSuffix(strings.ToLower(source), ".gguf") {
			return abs, nil
		}
		return "", fmt.Errorf("hf: %s is a file but not a .gguf file", source)
	}
	if filepath.IsAbs(source) || strings.HasPrefix(source, ".") || strings.HasPrefix(source, "~") {
		return "", fmt.Errorf("hf: model path %s does not exist", source)
	}
	ref, err := ParseRef(source)
	if err != nil {
		return "", fmt.Errorf("hf: %q is neither an existing path nor a Hugging Face id: %w", source, err)
	}
	c, err := newClient(o)
	if err != nil {
		return "", err
	}
	if p, err := c.store.lookup(ref, c.opts.Layers); err == nil {
		return p, nil
	} else if !errors.Is(err, ErrNotInStore) {
		return "", err
	}
	if c.opts.offline() {
		return "", offlineErr(ref, ErrNotInStore)
	}
	return c.pull(ctx, ref)
}

// offlineErr is err for ref in offline mode, with what fixes it.
func offlineErr(ref Ref, err error) error {
	return fmt.Errorf("%s: %w (offline: nothing is downloaded; run `exo model pull %s` where the Hub is reachable, into this store)", ref, err, ref)
}

// Pull asks the Hub for the current commit of ref and makes sure that
// snapshot is complete in the store, downloading what is missing. It returns
// the local path (the snapshot directory, or the .gguf file when ref names
// one). In offline mode it behaves like Resolve on the store only.
func Pull(ctx context.Context, ref Ref, o Options) (string, error) {
	c, err := newClient(o)
	if err != nil {
		return "", err
	}
	if c.opts.offline() {
		p, err := c.store.lookup(ref, c.opts.Layers)
		if err != nil {
			return "", offlineErr(ref, err)
		}
		return p, nil
	}
	return c.pull(ctx, ref)
}
