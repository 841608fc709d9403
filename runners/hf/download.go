package hf

import (
	"context"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// dlState is the resume record of one .partial file: how many bytes of each
// chunk are already written. It is saved next to the .partial file; a
// record that does not match the file's size, hash or chunking is discarded
// with the partial data.
type dlState struct {
	mu     sync.Mutex
	Size   int64   `json:"size"`
	SHA256 string  `json:"sha256,omitempty"`
	BlobID string  `json:"blob_id,omitempty"`
	Chunk  int64   `json:"chunk"`
	Done   []int64 `json:"done"`
	path   string
	dirty  int64
}

func loadState(p string) *dlState {
	b, err := os.ReadFile(p)
	if err != nil {
		return nil
	}
	var s dlState
	if json.Unmarshal(b, &s) != nil {
		return nil
	}
	s.path = p
	return &s
}

func (s *dlState) add(i int, n int64) (save bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.Done[i] += n
	s.dirty += n
	return s.dirty >= 16<<20
}

func (s *dlState) done(i int) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.Done[i]
}

func (s *dlState) save() error {
	s.mu.Lock()
	b, err := json.Marshal(s)
	s.dirty = 0
	s.mu.Unlock()
	if err != nil {
		return err
	}
	return writeAtomic(s.path, b)
}

var (
	hex64 = regexp.MustCompile(`^[0-9a-f]{64}$`)
	hex40 = regexp.MustCompile(`^[0-9a-f]{40}$`)
)

// safeName checks that a repository path stays inside the snapshot.
func safeName(name string) error {
	if name == "" || strings.HasPrefix(name, "/") || path.Clean(name) != name || name == ".." ||
		strings.HasPrefix(name, "../") || strings.Contains(name, "\\") || strings.HasSuffix(name, ".partial") ||
		strings.HasSuffix(name, ".partial.json") || path.Base(name) == manifestName {
		return fmt.Errorf("hf: refusing repository path %q", name)
	}
	return nil
}

// fetchFile makes dir/f.Name a whole, verified copy of f, resuming a
// .partial left by an earlier attempt, and re-fetching once from scratch
// when verification fails.
func (c *client) fetchFile(ctx context.Context, repo, commit, dir string, f repoFile, sem chan struct{}, prog *progress) error {
	if err := safeName(f.Name); err != nil {
		return err
	}
	final := filepath.Join(dir, filepath.FromSlash(f.Name))
	if st, err := os.Stat(final); err == nil {
		// Only verified files are ever renamed into place.
		if f.Size < 0 || st.Size() == f.Size {
			prog.done.Add(st.Size())
			return nil
		}
		os.Remove(final)
	}
	if err := os.MkdirAll(filepath.Dir(final), 0o755); err != nil {
		return fmt.Errorf("hf: store: %w", err)
	}
	u := c.fileURL(repo, commit, f.Name)
	if f.Size < 0 {
		if err := c.head(ctx, u, &f); err != nil {
			return err
		}
	}
	log := c.opts.logger()
	for attempt := 0; ; attempt++ {
		got, err := c.download(ctx, u, final, f, sem, prog)
		if err == nil {
			log.Debug("fetched", "file", f.Name, "bytes", got)
			return nil
		}
		prog.done.Add(-got)
		if !errors.Is(err, ErrChecksum) || attempt >= 1 {
			return fmt.Errorf("hf: %s: %w", f.Name, err)
		}
		log.Warn("downloaded file failed verification; fetching it again", "file", f.Name, "err", err)
	}
}

// head learns size and hash of a file the API did not describe, from the
// headers the Hub sets on its resolve response.
func (c *client) head(ctx context.Context, u string, f *repoFile) error {
	req, err := c.newRequest(ctx, http.MethodHead, u)
	if err != nil {
		return err
	}
	hc := &http.Client{Transport: c.http.Transport, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("hf: HEAD %s: %w", f.Name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 400 {
		return statusError("hf: HEAD "+f.Name, resp)
	}
	etag := strings.Trim(strings.TrimPrefix(resp.Header.Get("X-Linked-Etag"), "W/"), `"`)
	size := resp.Header.Get("X-Linked-Size")
	if etag == "" {
		etag = strings.Trim(strings.TrimPrefix(resp.Header.Get("ETag"), "W/"), `"`)
	}
	if size == "" && resp.StatusCode == http.StatusOK {
		size = resp.Header.Get("Content-Length")
	}
	if n, err := strconv.ParseInt(size, 10, 64); err == nil && n >= 0 {
		f.Size = n
	}
	switch {
	case hex64.MatchString(etag):
		f.SHA256 = etag
	case hex40.MatchString(etag):
		f.BlobID = etag
	}
	return nil
}

// download fetches one attempt of f into final (via final.partial). It
// returns the bytes it counted as done (so a failed attempt can be
// uncounted) and ErrChecksum when the result fails verification.
func (c *client) download(ctx context.Context, u, final string, f repoFile, sem chan struct{}, prog *progress) (int64, error) {
	partial := final + ".partial"
	statePath := partial + ".json"
	if f.Size < 0 {
		return c.downloadStream(ctx, u, final, partial, f, sem, prog)
	}
	chunk := max(c.chunkSize, 1)
	n := int((f.Size + chunk - 1) / chunk)
	st := loadState(statePath)
	fresh := st == nil || st.Size != f.Size || st.SHA256 != f.SHA256 || st.BlobID != f.BlobID || st.Chunk != chunk || len(st.Done) != n
	flags := os.O_RDWR | os.O_CREATE
	if fresh {
		st = &dlState{Size: f.Size, SHA256: f.SHA256, BlobID: f.BlobID, Chunk: chunk, Done: make([]int64, n), path: statePath}
		flags |= os.O_TRUNC
	}
	file, err := os.OpenFile(partial, flags, 0o644)
	if err != nil {
		return 0, fmt.Errorf("store: %w", err)
	}
	defer file.Close()
	if fresh {
		if err := st.save(); err != nil {
			return 0, err
		}
	}
	var counted int64
	for i := range n {
		counted += st.Done[i]
	}
	if counted > 0 {
		c.opts.logger().Info("resuming download", "file", f.Name, "have_bytes", counted, "size", f.Size)
	}
	prog.done.Add(counted)

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	var mu sync.Mutex
	for i := range n {
		start := int64(i) * chunk
		end := min(start+chunk, f.Size) - 1
		if st.Done[i] >= end-start+1 {
			continue
		}
		wg.Go(func() {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			defer func() { <-sem }()
			got, err := c.fetchRange(ctx, u, file, st, i, start, end, f.Size, prog)
			mu.Lock()
			counted += got
			mu.Unlock()
			if err != nil {
				cancel(err)
			}
		})
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		if serr := st.save(); serr != nil {
			c.opts.logger().Warn("could not save resume state", "file", f.Name, "err", serr)
		}
		return counted, err
	}
	if err := file.Sync(); err != nil {
		return counted, storeErr(err)
	}
	if err := verify(file, f); err != nil {
		file.Close()
		os.Remove(partial)
		os.Remove(statePath)
		return counted, err
	}
	if err := file.Close(); err != nil {
		return counted, storeErr(err)
	}
	if err := os.Rename(partial, final); err != nil {
		return counted, fmt.Errorf("store: %w", err)
	}
	os.Remove(statePath)
	return counted, nil
}

// fetchRange writes bytes start..end (inclusive) of the file into file,
// beginning where the state says this chunk stopped, retrying failed
// connections with backoff. The retry budget resets whenever bytes arrive.
func (c *client) fetchRange(ctx context.Context, u string, file *os.File, st *dlState, i int, start, end, size int64, prog *progress) (int64, error) {
	var got int64
	failures := 0
	for {
		off := start + st.done(i)
		if off > end {
			return got, nil
		}
		n, err := c.getRange(ctx, u, file, st, i, off, end, size, prog)
		got += n
		if err == nil {
			continue // loop checks completion
		}
		if n > 0 {
			failures = 0
		}
		if ctx.Err() != nil {
			return got, context.Cause(ctx)
		}
		if !retryable(err) || failures >= c.retries {
			return got, err
		}
		c.opts.logger().Debug("retrying range", "url", u, "offset", off, "err", err)
		if err := c.sleep(ctx, failures); err != nil {
			return got, err
		}
		failures++
	}
}

// getRange makes one ranged request and copies what arrives.
func (c *client) getRange(ctx context.Context, u string, file *os.File, st *dlState, i int, off, end, size int64, prog *progress) (int64, error) {
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var stalled atomic.Bool
	stall := time.AfterFunc(c.stall, func() { stalled.Store(true); cancel() })
	defer stall.Stop()
	n, err := c.copyRange(rctx, u, file, st, i, off, end, size, prog, stall)
	if err != nil && stalled.Load() && ctx.Err() == nil {
		err = fmt.Errorf("no data for %s at byte %d: %w", c.stall, off+n, errStalled)
	}
	return n, err
}

// storeErr wraps an error of the store's filesystem; a full disk becomes
// ErrNoSpace with what is kept for the next pull.
func storeErr(err error) error {
	if errors.Is(err, syscall.ENOSPC) {
		return fmt.Errorf("store: %w: the disk filled up during the download (%w); the partial file is kept and the next pull resumes it", ErrNoSpace, err)
	}
	return fmt.Errorf("store: %w", err)
}

// errStalled: a connection delivered nothing for the stall timeout (retried).
var errStalled = errors.New("connection stalled")

func (c *client) copyRange(rctx context.Context, u string, file *os.File, st *dlState, i int, off, end, size int64, prog *progress, stall *time.Timer) (int64, error) {
	req, err := c.newRequest(rctx, http.MethodGet, u)
	if err != nil {
		return 0, &fatalError{err}
	}
	req.Header.Set("Range", fmt.Sprintf("bytes=%d-%d", off, end))
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusPartialContent:
		cr := resp.Header.Get("Content-Range")
		if !strings.HasPrefix(cr, fmt.Sprintf("bytes %d-", off)) {
			return 0, fmt.Errorf("server answered range %d- with %q", off, cr)
		}
	case http.StatusOK:
		if off != 0 || end != size-1 {
			return 0, &fatalError{errors.New("server ignored the Range header")}
		}
	default:
		return 0, statusError("GET "+u, resp)
	}
	buf := make([]byte, 256<<10)
	var got int64
	for off <= end {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			stall.Reset(c.stall)
			w := min(int64(n), end-off+1)
			if _, err := c.writeAt(file, buf[:w], off); err != nil {
				return got, &fatalError{storeErr(err)}
			}
			off += w
			got += w
			prog.done.Add(w)
			prog.fetched.Add(w)
			if st.add(i, w) {
				if err := st.save(); err != nil {
					return got, &fatalError{storeErr(err)}
				}
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return got, rerr
		}
	}
	if off <= end {
		return got, fmt.Errorf("connection closed at byte %d of range ending %d: %w", off, end, io.ErrUnexpectedEOF)
	}
	return got, nil
}

// downloadStream fetches a file of unknown size in one request (no resume).
func (c *client) downloadStream(ctx context.Context, u, final, partial string, f repoFile, sem chan struct{}, prog *progress) (int64, error) {
	select {
	case sem <- struct{}{}:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	defer func() { <-sem }()
	req, err := c.newRequest(ctx, http.MethodGet, u)
	if err != nil {
		return 0, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, statusError("GET "+u, resp)
	}
	file, err := os.Create(partial)
	if err != nil {
		return 0, fmt.Errorf("store: %w", err)
	}
	defer file.Close()
	n, err := io.Copy(file, io.TeeReader(resp.Body, countWriter{prog}))
	if err != nil {
		os.Remove(partial) // no resume without a known size
		if errors.Is(err, syscall.ENOSPC) {
			return n, storeErr(err)
		}
		return n, err
	}
	f.Size = n
	if err := file.Sync(); err != nil {
		return n, err
	}
	if err := verify(file, f); err != nil {
		os.Remove(partial)
		return n, err
	}
	file.Close()
	return n, os.Rename(partial, final)
}

type countWriter struct{ p *progress }

func (w countWriter) Write(b []byte) (int, error) {
	w.p.done.Add(int64(len(b)))
	w.p.fetched.Add(int64(len(b)))
	return len(b), nil
}

// verify checks a finished file against its size and its LFS sha256 or git
// blob id, whichever is known.
func verify(file *os.File, f repoFile) error {
	st, err := file.Stat()
	if err != nil {
		return err
	}
	if f.Size >= 0 && st.Size() != f.Size {
		return fmt.Errorf("%w: size %d, want %d", ErrChecksum, st.Size(), f.Size)
	}
	var h hash.Hash
	var want string
	switch {
	case f.SHA256 != "":
		h, want = sha256.New(), f.SHA256
	case f.BlobID != "":
		h, want = sha1.New(), f.BlobID
		fmt.Fprintf(h, "blob %d\x00", st.Size())
	default:
		return nil
	}
	if _, err := io.Copy(h, io.NewSectionReader(file, 0, st.Size())); err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != want {
		return fmt.Errorf("%w: got %s, want %s", ErrChecksum, got, want)
	}
	return nil
}
