package hf

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"
)

// The store keeps one directory per repository:
//
//	<store>/<org>/<name>/.lock                 flock'd while pulling or removing
//	<store>/<org>/<name>/refs/<rev>           the commit a branch or tag resolved to
//	<store>/<org>/<name>/snapshots/<commit>/  the files, under their repository paths
//	<store>/<org>/<name>/snapshots/<commit>/.exo-manifest.json   written last: the snapshot is complete
//
// Files are downloaded as <file>.partial (with <file>.partial.json holding
// the resume state) and renamed into place once verified, so a name without
// .partial is always a whole, verified file.
type store struct{ dir string }

const manifestName = ".exo-manifest.json"

// manifest records a completed pull of one commit.
type manifest struct {
	Repo      string         `json:"repo"`
	Commit    string         `json:"commit"`
	Revisions []string       `json:"revisions"` // refs that resolved to this commit
	Full      bool           `json:"full"`      // the safetensors model set was pulled (not only a named file)
	Files     []manifestFile `json:"files"`
	PulledAt  time.Time      `json:"pulled_at"`
}

type manifestFile struct {
	Name   string `json:"name"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256,omitempty"`
}

var commitRE = regexp.MustCompile(`^[0-9a-f]{40}$`)

func (s store) repoDir(repo string) string {
	org, name, _ := strings.Cut(repo, "/")
	return filepath.Join(s.dir, org, name)
}

func (s store) snapshotDir(repo, commit string) string {
	return filepath.Join(s.repoDir(repo), "snapshots", commit)
}

func (s store) refPath(repo, rev string) string {
	return filepath.Join(s.repoDir(repo), "refs", url.PathEscape(rev))
}

func (s store) readManifest(repo, commit string) (*manifest, error) {
	b, err := os.ReadFile(filepath.Join(s.snapshotDir(repo, commit), manifestName))
	if err != nil {
		return nil, err
	}
	var m manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("hf: store manifest of %s@%s: %w", repo, commit, err)
	}
	return &m, nil
}

// commitFor returns the commit a revision points to in the store.
func (s store) commitFor(repo, rev string) (string, error) {
	if commitRE.MatchString(rev) {
		return rev, nil
	}
	b, err := os.ReadFile(s.refPath(repo, rev))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", ErrNotInStore
		}
		return "", fmt.Errorf("hf: store: %w", err)
	}
	c := strings.TrimSpace(string(b))
	if !commitRE.MatchString(c) {
		return "", fmt.Errorf("hf: store ref %s@%s is corrupt", repo, rev)
	}
	return c, nil
}

// lookup returns the local path of ref when its snapshot is complete, or,
// for a pipeline stage's layers (not zero), holds every file they need.
func (s store) lookup(ref Ref, layers LayerRange) (string, error) {
	commit, err := s.commitFor(ref.Repo, ref.Revision)
	if err != nil {
		return "", err
	}
	return s.lookupCommit(ref, commit, layers)
}

func (s store) lookupCommit(ref Ref, commit string, layers LayerRange) (string, error) {
	m, err := s.readManifest(ref.Repo, commit)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", ErrNotInStore
		}
		return "", err
	}
	dir := s.snapshotDir(ref.Repo, commit)
	if ref.File == "" {
		if !m.Full && !s.holdsStage(m, dir, layers) {
			return "", ErrNotInStore
		}
		return dir, nil
	}
	for _, f := range m.Files {
		if f.Name == ref.File {
			return filepath.Join(dir, filepath.FromSlash(f.Name)), nil
		}
	}
	return "", ErrNotInStore
}

// holdsStage reports whether a partial snapshot (a pipeline stage's pull)
// holds every file the stage of layers needs: the metadata and the weight
// files its shard index assigns to those layers (stageFiles).
func (s store) holdsStage(m *manifest, dir string, layers LayerRange) bool {
	if layers.IsZero() {
		return false
	}
	have := map[string]bool{}
	for _, f := range m.Files {
		have[f.Name] = true
	}
	if !have["config.json"] || !have["model.safetensors.index.json"] {
		return false
	}
	need, err := stageFilesIn(dir, layers)
	if err != nil {
		return false
	}
	for f := range need {
		if !have[f] {
			return false
		}
	}
	return true
}

// complete writes the manifest (merging with an earlier one for the same
// commit) and then the ref, each atomically.
func (s store) complete(m manifest, rev string) error {
	if old, err := s.readManifest(m.Repo, m.Commit); err == nil {
		m.Full = m.Full || old.Full
		if m.PulledAt.IsZero() {
			m.PulledAt = old.PulledAt
		}
		have := map[string]bool{}
		for _, f := range m.Files {
			have[f.Name] = true
		}
		for _, f := range old.Files {
			if !have[f.Name] {
				m.Files = append(m.Files, f)
			}
		}
		for _, r := range old.Revisions {
			if !contains(m.Revisions, r) {
				m.Revisions = append(m.Revisions, r)
			}
		}
	}
	if !contains(m.Revisions, rev) {
		m.Revisions = append(m.Revisions, rev)
	}
	sort.Slice(m.Files, func(i, j int) bool { return m.Files[i].Name < m.Files[j].Name })
	sort.Strings(m.Revisions)
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	if err := writeAtomic(filepath.Join(s.snapshotDir(m.Repo, m.Commit), manifestName), append(b, '\n')); err != nil {
		return err
	}
	if rev == m.Commit {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(s.refPath(m.Repo, rev)), 0o755); err != nil {
		return fmt.Errorf("hf: store: %w", err)
	}
	return writeAtomic(s.refPath(m.Repo, rev), []byte(m.Commit+"\n"))
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// writeAtomic writes data to a temporary file next to path, syncs it and
// renames it over path.
func writeAtomic(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return fmt.Errorf("hf: store: %w", err)
	}
	tmp := f.Name()
	_, werr := f.Write(data)
	if werr == nil {
		werr = f.Sync()
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Rename(tmp, path)
	}
	if werr != nil {
		os.Remove(tmp)
		return fmt.Errorf("hf: store: write %s: %w", path, werr)
	}
	return nil
}

// Model is one complete snapshot in the store.
type Model struct {
	Repo      string
	Revisions []string // branches/tags that resolved to Commit when pulled
	Commit    string
	Size      int64 // bytes of its files
	Path      string
	Full      bool     // a whole safetensors model (else only named files: one .gguf, or a pipeline stage's shards)
	Files     []string // repository paths
}

// List returns every complete snapshot in the store, sorted by repository.
func List(o Options) ([]Model, error) {
	dir, err := o.storeDir()
	if err != nil {
		return nil, err
	}
	s := store{dir}
	paths, err := filepath.Glob(filepath.Join(dir, "*", "*", "snapshots", "*", manifestName))
	if err != nil {
		return nil, err
	}
	var out []Model
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		var m manifest
		if json.Unmarshal(b, &m) != nil || !commitRE.MatchString(m.Commit) {
			continue
		}
		md := Model{Repo: m.Repo, Revisions: m.Revisions, Commit: m.Commit, Path: s.snapshotDir(m.Repo, m.Commit), Full: m.Full}
		for _, f := range m.Files {
			md.Size += f.Size
			md.Files = append(md.Files, f.Name)
		}
		out = append(out, md)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Repo != out[j].Repo {
			return out[i].Repo < out[j].Repo
		}
		return out[i].Commit < out[j].Commit
	})
	return out, nil
}

// Remove deletes a repository (every snapshot of it) from the store. It
// waits for a pull of the same repository in another process to finish.
func Remove(ctx context.Context, repo string, o Options) error {
	ref, err := ParseRef(repo)
	if err != nil {
		return err
	}
	if ref.File != "" || strings.Contains(repo, "@") {
		return fmt.Errorf("hf: remove takes a repository id (org/name), not %q", repo)
	}
	dir, err := o.storeDir()
	if err != nil {
		return err
	}
	s := store{dir}
	rd := s.repoDir(ref.Repo)
	if _, err := os.Stat(rd); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%s: %w", ref.Repo, ErrNotInStore)
		}
		return err
	}
	unlock, err := lockFile(ctx, filepath.Join(rd, ".lock"))
	if err != nil {
		return err
	}
	defer unlock()
	// Rename first so the repository disappears at once, then delete.
	trash := filepath.Join(filepath.Dir(rd), fmt.Sprintf(".trash-%s-%d", filepath.Base(rd), time.Now().UnixNano()))
	if err := os.Rename(rd, trash); err != nil {
		return fmt.Errorf("hf: remove %s: %w", ref.Repo, err)
	}
	if err := os.RemoveAll(trash); err != nil {
		return fmt.Errorf("hf: remove %s: %w", ref.Repo, err)
	}
	return nil
}
