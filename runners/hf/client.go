package hf

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// client pulls from one endpoint into one store. Its unexported knobs have
// production defaults; the tests shrink them.
type client struct {
	opts      Options
	store     store
	endpoint  *url.URL
	http      *http.Client
	chunkSize int64         // bytes per ranged request
	parallel  int           // concurrent connections per pull
	retries   int           // attempts per chunk after the first
	backoff   time.Duration // first retry delay (doubles, capped at 5s)
	stall     time.Duration // abort a connection that delivers nothing for this long
	tick      time.Duration // progress reporting interval
	logEvery  time.Duration // progress log interval
	free      func(dir string) (int64, error)
	// writeAt writes downloaded bytes into a .partial file (tests inject
	// faults such as a full disk here).
	writeAt func(f *os.File, b []byte, off int64) (int, error)
}

func newClient(o Options) (*client, error) {
	dir, err := o.storeDir()
	if err != nil {
		return nil, err
	}
	ep, err := url.Parse(o.endpoint())
	if err != nil || (ep.Scheme != "http" && ep.Scheme != "https") || ep.Host == "" {
		return nil, fmt.Errorf("hf: bad endpoint %q (want http(s)://host)", o.endpoint())
	}
	c := &client{
		opts:      o,
		store:     store{dir},
		endpoint:  ep,
		chunkSize: 64 << 20,
		parallel:  8,
		retries:   5,
		backoff:   250 * time.Millisecond,
		stall:     60 * time.Second,
		tick:      250 * time.Millisecond,
		logEvery:  10 * time.Second,
		free:      freeBytes,
		writeAt:   (*os.File).WriteAt,
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.ResponseHeaderTimeout = 60 * time.Second
	tr.MaxIdleConnsPerHost = 16
	c.http = &http.Client{Transport: tr, CheckRedirect: c.checkRedirect}
	return c, nil
}

// checkRedirect follows up to 10 redirects and keeps the token only for the
// endpoint's own scheme://host:port (the Hub redirects LFS files to a CDN,
// which must never see it). net/http's own rule ignores the port.
func (c *client) checkRedirect(req *http.Request, via []*http.Request) error {
	if len(via) >= 10 {
		return errors.New("hf: too many redirects")
	}
	if req.URL.Scheme != c.endpoint.Scheme || req.URL.Host != c.endpoint.Host {
		req.Header.Del("Authorization")
	}
	return nil
}

// base is the endpoint URL without a trailing slash.
func (c *client) base() string { return strings.TrimRight(c.endpoint.String(), "/") }

// fileURL is the download URL of one file at a commit.
func (c *client) fileURL(repo, commit, name string) string {
	segs := strings.Split(name, "/")
	for i, s := range segs {
		segs[i] = url.PathEscape(s)
	}
	return c.base() + "/" + repo + "/resolve/" + commit + "/" + strings.Join(segs, "/")
}

// newRequest builds a request for an endpoint URL with the token attached.
func (c *client) newRequest(ctx context.Context, method, u string) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, u, nil)
	if err != nil {
		return nil, err
	}
	if t := c.opts.token(); t != "" {
		req.Header.Set("Authorization", "Bearer "+t)
	}
	req.Header.Set("User-Agent", "exo-pd")
	return req, nil
}

// statusError maps an HTTP status to the package's sentinels.
func statusError(what string, resp *http.Response) error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	msg := strings.TrimSpace(string(body))
	switch resp.StatusCode {
	case http.StatusNotFound:
		return fmt.Errorf("%s: %w (HTTP 404)", what, ErrNotFound)
	case http.StatusUnauthorized, http.StatusForbidden:
		return fmt.Errorf("%s: %w (HTTP %d)", what, ErrUnauthorized, resp.StatusCode)
	}
	return &httpError{what: what, code: resp.StatusCode, msg: msg}
}

type httpError struct {
	what string
	code int
	msg  string
}

func (e *httpError) Error() string {
	return fmt.Sprintf("%s: HTTP %d %s", e.what, e.code, e.msg)
}

// retryable reports whether a failed request may succeed when repeated.
func retryable(err error) bool {
	if errors.Is(err, ErrNotFound) || errors.Is(err, ErrUnauthorized) || errors.Is(err, context.Canceled) {
		return false
	}
	var he *httpError
	if errors.As(err, &he) {
		return he.code >= 500 || he.code == http.StatusTooManyRequests || he.code == http.StatusRequestTimeout
	}
	var fe *fatalError
	return !errors.As(err, &fe)
}

// fatalError marks a failure that repeating the same request cannot fix.
type fatalError struct{ err error }

func (e *fatalError) Error() string { return e.err.Error() }
func (e *fatalError) Unwrap() error { return e.err }

// repoFile is one file of a repository at a commit, as the API lists it.
type repoFile struct {
	Name   string // repository path
	Size   int64  // -1 when unknown
	SHA256 string // LFS files: the content hash
	BlobID string // git blob id (SHA-1 of "blob <size>\0<content>"); checked for non-LFS files
}

type modelInfo struct {
	Commit string
	Files  []repoFile
}

// apiInfo is the part of GET /api/models/{repo}/revision/{rev}?blobs=true we use.
type apiInfo struct {
	SHA      string `json:"sha"`
	Siblings []struct {
		RFilename string `json:"rfilename"`
		Size      *int64 `json:"size"`
		BlobID    string `json:"blobId"`
		LFS       *struct {
			SHA256 string `json:"sha256"`
			OID    string `json:"oid"`
			Size   int64  `json:"size"`
		} `json:"lfs"`
	} `json:"siblings"`
}

// info resolves ref's revision to a commit and lists its files.
func (c *client) info(ctx context.Context, ref Ref) (*modelInfo, error) {
	u := c.base() + "/api/models/" + ref.Repo + "/revision/" + url.PathEscape(ref.Revision) + "?blobs=true"
	req, err := c.newRequest(ctx, http.MethodGet, u)
	if err != nil {
		return nil, err
	}
	what := fmt.Sprintf("hf: model info %s@%s", ref.Repo, ref.Revision)
	var resp *http.Response
	for attempt := 0; ; attempt++ {
		resp, err = c.http.Do(req)
		if err == nil && resp.StatusCode == http.StatusOK {
			break
		}
		if err == nil {
			err = statusError(what, resp)
			resp.Body.Close()
		} else if ctx.Err() == nil {
			// No answer at all: the network, DNS, a proxy, or a wrong endpoint.
			err = fmt.Errorf("%s: cannot reach the Hugging Face Hub at %s (check the network, HTTPS_PROXY, or HF_ENDPOINT for a mirror; or pull with `exo model pull` where it is reachable, copy the store here and set offline = true): %w", what, c.base(), err)
		} else {
			err = fmt.Errorf("%s: %w", what, err)
		}
		if attempt >= c.retries || !retryable(err) || ctx.Err() != nil {
			return nil, err
		}
		if werr := c.sleep(ctx, attempt); werr != nil {
			return nil, werr
		}
	}
	defer resp.Body.Close()
	var ai apiInfo
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&ai); err != nil {
		return nil, fmt.Errorf("%s: decode: %w", what, err)
	}
	if !commitRE.MatchString(ai.SHA) {
		return nil, fmt.Errorf("%s: the Hub returned no commit id", what)
	}
	mi := &modelInfo{Commit: ai.SHA}
	for _, s := range ai.Siblings {
		f := repoFile{Name: s.RFilename, Size: -1, BlobID: s.BlobID}
		if s.Size != nil {
			f.Size = *s.Size
		}
		if s.LFS != nil {
			f.SHA256 = s.LFS.SHA256
			if f.SHA256 == "" {
				f.SHA256 = strings.TrimPrefix(s.LFS.OID, "sha256:")
			}
			if s.LFS.Size > 0 {
				f.Size = s.LFS.Size
			}
			f.BlobID = "" // the blob is the pointer, not the content
		}
		mi.Files = append(mi.Files, f)
	}
	return mi, nil
}

func (c *client) sleep(ctx context.Context, attempt int) error {
	d := c.backoff << min(attempt, 10)
	d = min(d, 5*time.Second)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// metaFiles are the small files a safetensors model needs besides weights.
var metaFiles = map[string]bool{
	"config.json":                  true,
	"generation_config.json":       true,
	"tokenizer.json":               true,
	"tokenizer_config.json":        true,
	"special_tokens_map.json":      true,
	"model.safetensors.index.json": true,
	"chat_template.jinja":          true,
	"chat_template.json":           true,
	"tokenizer.model":              true,
	"vocab.json":                   true,
	"merges.txt":                   true,
	"added_tokens.json":            true,
}

// selectFiles picks what a model needs: the named .gguf, or the metadata
// files plus the top-level .safetensors files.
func selectFiles(mi *modelInfo, ref Ref) (meta, weights []repoFile, err error) {
	if ref.File != "" {
		for _, f := range mi.Files {
			if f.Name == ref.File {
				return nil, []repoFile{f}, nil
			}
		}
		return nil, nil, fmt.Errorf("hf: %s has no file %s at %s: %w", ref.Repo, ref.File, mi.Commit[:12], ErrNotFound)
	}
	var ggufs []string
	for _, f := range mi.Files {
		switch {
		case metaFiles[f.Name]:
			meta = append(meta, f)
		case !strings.Contains(f.Name, "/") && strings.HasSuffix(f.Name, ".safetensors"):
			weights = append(weights, f)
		case strings.HasSuffix(strings.ToLower(f.Name), ".gguf"):
			ggufs = append(ggufs, f.Name)
		}
	}
	hasConfig := false
	for _, f := range meta {
		hasConfig = hasConfig || f.Name == "config.json"
	}
	if !hasConfig || len(weights) == 0 {
		if len(ggufs) > 0 {
			sort.Strings(ggufs)
			return nil, nil, fmt.Errorf("hf: %s has no safetensors model; name one GGUF file, e.g. %s/%s", ref.Repo, ref.Repo, ggufs[0])
		}
		return nil, nil, fmt.Errorf("hf: %s has no config.json and .safetensors files: not a model exo can load", ref.Repo)
	}
	return meta, weights, nil
}

// pull downloads ref's current commit into the store (if not already
// complete) and returns its local path.
func (c *client) pull(ctx context.Context, ref Ref) (string, error) {
	log := c.opts.logger().With("model", ref)
	mi, err := c.info(ctx, ref)
	if err != nil {
		return "", err
	}
	meta, weights, err := selectFiles(mi, ref)
	if err != nil {
		return "", err
	}
	layers := c.opts.Layers
	if !layers.IsZero() && ref.File != "" {
		// Split GGUFs are not supported: a stage reads its layers from the whole file.
		log.Info("a GGUF file is fetched whole, whatever the stage's layers", "layers", layers.String())
		layers = LayerRange{}
	}
	unlock, err := lockFile(ctx, filepath.Join(c.store.repoDir(ref.Repo), ".lock"))
	if err != nil {
		return "", err
	}
	defer unlock()
	// Another process may have completed this commit while we waited.
	if p, err := c.store.lookupCommit(ref, mi.Commit, layers); err == nil {
		if err := c.store.complete(manifest{Repo: ref.Repo, Commit: mi.Commit}, ref.Revision); err != nil {
			return "", err
		}
		return p, nil
	}
	dir := c.store.snapshotDir(ref.Repo, mi.Commit)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("hf: store: %w", err)
	}
	// A stage's share is known once the index is here: its space is
	// checked then, before any weights are fetched.
	if layers.IsZero() {
		if err := c.checkSpace(dir, append(append([]repoFile(nil), meta...), weights...)); err != nil {
			return "", err
		}
	}
	start := time.Now()
	prog := newProgress(c.opts.Progress)
	for _, f := range append(append([]repoFile(nil), meta...), weights...) {
		prog.addTotal(f.Size)
	}
	stopReport := prog.run(c.tick, c.logEvery, log)
	defer stopReport()
	log.Info("pulling model", "commit", mi.Commit[:12], "files", len(meta)+len(weights), "bytes", prog.total.Load(), "store", dir)

	// Metadata first: the shard index says which weight files are needed.
	if err := c.fetchAll(ctx, ref, mi.Commit, dir, meta, prog); err != nil {
		return "", err
	}
	full := ref.File == ""
	if idx := filepath.Join(dir, "model.safetensors.index.json"); fileExists(idx) {
		weights, err = filterByIndex(idx, weights, prog)
		if err != nil {
			return "", err
		}
		if !layers.IsZero() {
			all := len(weights)
			if weights, err = filterByLayers(dir, weights, layers, prog); err != nil {
				return "", err
			}
			full = len(weights) == all
			log.Info("pulling a pipeline stage's files", "layers", layers.String(), "weight_files", len(weights), "of", all)
		}
	} else if !layers.IsZero() {
		log.Info("no shard index: the stage's layers need every weight file", "layers", layers.String())
	}
	if !layers.IsZero() {
		if err := c.checkSpace(dir, append(append([]repoFile(nil), meta...), weights...)); err != nil {
			return "", err
		}
	}
	if err := c.fetchAll(ctx, ref, mi.Commit, dir, weights, prog); err != nil {
		return "", err
	}
	m := manifest{Repo: ref.Repo, Commit: mi.Commit, Full: full, PulledAt: time.Now().UTC()}
	for _, f := range append(meta, weights...) {
		st, err := os.Stat(filepath.Join(dir, filepath.FromSlash(f.Name)))
		if err != nil {
			return "", fmt.Errorf("hf: store: %w", err)
		}
		m.Files = append(m.Files, manifestFile{Name: f.Name, Size: st.Size(), SHA256: f.SHA256})
	}
	if err := c.store.complete(m, ref.Revision); err != nil {
		return "", err
	}
	stopReport()
	el := time.Since(start)
	log.Info("pulled model", "commit", mi.Commit[:12], "bytes", prog.done.Load(), "downloaded_bytes", prog.fetched.Load(), "seconds", el.Seconds())
	return c.store.lookupCommit(ref, mi.Commit, layers)
}

// checkSpace fails early when the store's filesystem cannot hold what is
// still to be downloaded (files already in place or partly fetched count as
// present), rather than filling the disk half-way through a model.
func (c *client) checkSpace(dir string, files []repoFile) error {
	var need int64
	for _, f := range files {
		if f.Size <= 0 {
			continue
		}
		p := filepath.Join(dir, filepath.FromSlash(f.Name))
		have := int64(0)
		if st, err := os.Stat(p); err == nil {
			have = st.Size()
		} else if st, err := os.Stat(p + ".partial"); err == nil {
			have = min(st.Size(), f.Size) // sparse or partly written: count it as written
		}
		need += max(f.Size-have, 0)
	}
	free, err := c.free(dir)
	if c.opts.Plan != nil {
		known := free
		if err != nil {
			known = -1
		}
		c.opts.Plan(dir, need, known)
	}
	if err != nil || need == 0 {
		return nil // unknown: let the writes report it
	}
	// Keep a margin for the manifest, logs and the rest of the system.
	if margin := int64(64 << 20); free < need+margin {
		return fmt.Errorf("hf: %s: %w: need %s more, %s free", dir, ErrNoSpace, Bytes(need), Bytes(free))
	}
	return nil
}

// filterByIndex keeps the weight files the index's weight_map names.
func filterByIndex(idx string, weights []repoFile, prog *progress) ([]repoFile, error) {
	b, err := os.ReadFile(idx)
	if err != nil {
		return nil, fmt.Errorf("hf: %w", err)
	}
	var ix struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	if err := json.Unmarshal(b, &ix); err != nil {
		return nil, fmt.Errorf("hf: model.safetensors.index.json: %w", err)
	}
	need := map[string]bool{}
	for _, f := range ix.WeightMap {
		need[path.Clean(f)] = true
	}
	var out []repoFile
	for _, w := range weights {
		if need[w.Name] {
			out = append(out, w)
			delete(need, w.Name)
		} else {
			prog.addTotal(-w.Size)
		}
	}
	if len(need) > 0 {
		var missing []string
		for n := range need {
			missing = append(missing, n)
		}
		sort.Strings(missing)
		return nil, fmt.Errorf("hf: the shard index names files the repository lacks: %s", strings.Join(missing, ", "))
	}
	return out, nil
}

// fetchAll downloads files concurrently; the first error cancels the rest.
func (c *client) fetchAll(ctx context.Context, ref Ref, commit, dir string, files []repoFile, prog *progress) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	sem := make(chan struct{}, c.parallel)
	var wg sync.WaitGroup
	for _, f := range files {
		wg.Go(func() {
			if err := c.fetchFile(ctx, ref.Repo, commit, dir, f, sem, prog); err != nil {
				cancel(err)
			}
		})
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return err
	}
	return nil
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// progress counts bytes and reports them from one goroutine.
type progress struct {
	fn      func(done, total int64)
	done    atomic.Int64 // bytes in place (including resumed and already present)
	fetched atomic.Int64 // bytes received over the network
	total   atomic.Int64
}

func newProgress(fn func(done, total int64)) *progress { return &progress{fn: fn} }

func (p *progress) addTotal(n int64) {
	if n > 0 || n < 0 {
		p.total.Add(n)
	}
}

// run reports every tick until the returned stop is called (idempotent),
// which makes one final report. It also logs a progress line every logEvery
// (runners have no terminal: their logs show the download).
func (p *progress) run(tick, logEvery time.Duration, log *slog.Logger) (stop func()) {
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(tick)
		defer t.Stop()
		meter := NewMeter(30 * time.Second)
		last := time.Now()
		for {
			select {
			case <-quit:
				if p.fn != nil {
					p.fn(p.done.Load(), p.total.Load())
				}
				return
			case now := <-t.C:
				done, total := p.done.Load(), p.total.Load()
				if p.fn != nil {
					p.fn(done, total)
				}
				line := meter.Line(now, done, total)
				if logEvery > 0 && now.Sub(last) >= logEvery {
					last = now
					log.Info("downloading", "progress", strings.Join(strings.Fields(line), " "), "done_bytes", done, "total_bytes", total)
				}
			}
		}
	})
	var once sync.Once
	return func() { once.Do(func() { close(quit); wg.Wait() }) }
}
