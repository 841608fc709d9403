package hf

import (
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeHub speaks the parts of the Hugging Face Hub exo uses, on loopback:
// the model-info API, /resolve/ file URLs (LFS files redirect to a separate
// "CDN" server, as the Hub does), HEAD metadata headers, Range requests,
// 401 for gated repositories without the token, 404. It can cut a
// connection mid-body or corrupt a body, once per file.
type fakeHub struct {
	t     testing.TB
	hub   *httptest.Server
	cdn   *httptest.Server
	token string

	mu          sync.Mutex
	repos       map[string]*fakeRepo
	served      map[string]int64 // body bytes sent per file name
	ranges      map[string][]string
	apiCalls    int
	tokenLeaks  int
	cutAfter    map[string]int64 // cut the next response covering this file offset at that offset
	corruptNext map[string]int   // corrupt the next N full responses for this file
	stallAt     map[string]int64 // the next response covering this offset goes silent there
	hideMeta    bool             // the API omits sizes and LFS info (clients must HEAD)
	gate        chan struct{}    // when set, file bodies wait for it to close
}

type fakeRepo struct {
	commit string
	refs   map[string]string
	gated  bool
	files  map[string][]byte
	lfs    map[string]bool
	sha    map[string]string // sha256 of each file, computed once
}

func newFakeHub(t testing.TB) *fakeHub {
	h := &fakeHub{
		t: t, token: "hf_secret_token",
		repos: map[string]*fakeRepo{}, served: map[string]int64{}, ranges: map[string][]string{},
		cutAfter: map[string]int64{}, corruptNext: map[string]int{}, stallAt: map[string]int64{},
	}
	h.cdn = httptest.NewServer(http.HandlerFunc(h.serveCDN))
	h.hub = httptest.NewServer(http.HandlerFunc(h.serveHub))
	t.Cleanup(h.close)
	return h
}

func (h *fakeHub) close() { h.hub.Close(); h.cdn.Close() }

// addRepo registers a repository; files ending in .safetensors or .gguf are LFS.
func (h *fakeHub) addRepo(id string, gated bool, files map[string][]byte) *fakeRepo {
	sum := sha1.New()
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		sum.Write([]byte(n))
		sum.Write(files[n])
	}
	r := &fakeRepo{commit: hex.EncodeToString(sum.Sum(nil)), gated: gated, files: files, lfs: map[string]bool{}, sha: map[string]string{}}
	r.refs = map[string]string{"main": r.commit}
	for n := range files {
		r.lfs[n] = strings.HasSuffix(n, ".safetensors") || strings.HasSuffix(n, ".gguf")
		r.sha[n] = sha256hex(files[n])
	}
	h.mu.Lock()
	h.repos[id] = r
	h.mu.Unlock()
	return r
}

func (h *fakeHub) authorized(r *http.Request, repo *fakeRepo) bool {
	return !repo.gated || r.Header.Get("Authorization") == "Bearer "+h.token
}

func sha256hex(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

func blobID(b []byte) string {
	h := sha1.New()
	fmt.Fprintf(h, "blob %d\x00", len(b))
	h.Write(b)
	return hex.EncodeToString(h.Sum(nil))
}

func (h *fakeHub) serveHub(w http.ResponseWriter, r *http.Request) {
	p := strings.TrimPrefix(r.URL.Path, "/")
	if rest, ok := strings.CutPrefix(p, "api/models/"); ok {
		h.serveAPI(w, r, rest)
		return
	}
	// {org}/{name}/resolve/{commit}/{file...}
	parts := strings.SplitN(p, "/", 5)
	if len(parts) < 5 || parts[2] != "resolve" {
		http.NotFound(w, r)
		return
	}
	id, rev, name := parts[0]+"/"+parts[1], parts[3], parts[4]
	h.mu.Lock()
	repo := h.repos[id]
	h.mu.Unlock()
	if repo == nil {
		http.Error(w, "Repository not found", http.StatusNotFound)
		return
	}
	if !h.authorized(r, repo) {
		http.Error(w, "Access to model "+id+" is restricted", http.StatusUnauthorized)
		return
	}
	if c, ok := repo.refs[rev]; ok {
		rev = c
	}
	data, ok := repo.files[name]
	if !ok || rev != repo.commit {
		http.Error(w, "Entry not found", http.StatusNotFound)
		return
	}
	w.Header().Set("X-Repo-Commit", repo.commit)
	if repo.lfs[name] {
		w.Header().Set("X-Linked-Etag", `"`+repo.sha[name]+`"`)
		w.Header().Set("X-Linked-Size", strconv.Itoa(len(data)))
		http.Redirect(w, r, h.cdn.URL+"/cdn/"+id+"/"+name, http.StatusFound)
		return
	}
	w.Header().Set("ETag", `"`+blobID(data)+`"`)
	h.serveBody(w, r, name, data)
}

func (h *fakeHub) serveAPI(w http.ResponseWriter, r *http.Request, rest string) {
	// {org}/{name}/revision/{rev}
	parts := strings.SplitN(rest, "/", 4)
	if len(parts) != 4 || parts[2] != "revision" {
		http.NotFound(w, r)
		return
	}
	h.mu.Lock()
	h.apiCalls++
	repo := h.repos[parts[0]+"/"+parts[1]]
	hide := h.hideMeta
	h.mu.Unlock()
	if repo == nil {
		http.Error(w, `{"error":"Repository not found"}`, http.StatusNotFound)
		return
	}
	if !h.authorized(r, repo) {
		http.Error(w, `{"error":"Access to model is restricted. You must be authenticated."}`, http.StatusUnauthorized)
		return
	}
	commit, ok := repo.refs[parts[3]]
	if !ok && parts[3] == repo.commit {
		commit, ok = repo.commit, true
	}
	if !ok {
		http.Error(w, `{"error":"Invalid rev id"}`, http.StatusNotFound)
		return
	}
	type lfs struct {
		SHA256      string `json:"sha256"`
		Size        int    `json:"size"`
		PointerSize int    `json:"pointerSize"`
	}
	type sib struct {
		RFilename string `json:"rfilename"`
		BlobID    string `json:"blobId,omitempty"`
		Size      *int   `json:"size,omitempty"`
		LFS       *lfs   `json:"lfs,omitempty"`
	}
	var sibs []sib
	for n, data := range repo.files {
		s := sib{RFilename: n}
		if !hide {
			size := len(data)
			s.Size = &size
			if repo.lfs[n] {
				s.BlobID = strings.Repeat("ab", 20) // the pointer's blob, not the content's
				s.LFS = &lfs{SHA256: repo.sha[n], Size: size, PointerSize: 134}
			} else {
				s.BlobID = blobID(data)
			}
		}
		sibs = append(sibs, s)
	}
	sort.Slice(sibs, func(i, j int) bool { return sibs[i].RFilename < sibs[j].RFilename })
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{"id": parts[0] + "/" + parts[1], "sha": commit, "siblings": sibs})
}

func (h *fakeHub) serveCDN(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Authorization") != "" {
		h.mu.Lock()
		h.tokenLeaks++
		h.mu.Unlock()
		http.Error(w, "token sent to the CDN", http.StatusBadRequest)
		return
	}
	parts := strings.SplitN(strings.TrimPrefix(r.URL.Path, "/cdn/"), "/", 3)
	if len(parts) != 3 {
		http.NotFound(w, r)
		return
	}
	h.mu.Lock()
	repo := h.repos[parts[0]+"/"+parts[1]]
	h.mu.Unlock()
	if repo == nil || repo.files[parts[2]] == nil {
		http.NotFound(w, r)
		return
	}
	h.serveBody(w, r, parts[2], repo.files[parts[2]])
}

// serveBody answers GET/HEAD with one optional "bytes=a-b" range.
func (h *fakeHub) serveBody(w http.ResponseWriter, r *http.Request, name string, data []byte) {
	start, end := int64(0), int64(len(data))-1
	status := http.StatusOK
	if rg := r.Header.Get("Range"); rg != "" {
		a, b, ok := strings.Cut(strings.TrimPrefix(rg, "bytes="), "-")
		s, err1 := strconv.ParseInt(a, 10, 64)
		e, err2 := strconv.ParseInt(b, 10, 64)
		if b == "" {
			e, err2 = end, nil
		}
		if !ok || err1 != nil || err2 != nil || s > e || s >= int64(len(data)) {
			w.Header().Set("Content-Range", fmt.Sprintf("bytes */%d", len(data)))
			w.WriteHeader(http.StatusRequestedRangeNotSatisfiable)
			return
		}
		start, end = s, min(e, end)
		status = http.StatusPartialContent
		w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", start, end, len(data)))
		h.mu.Lock()
		h.ranges[name] = append(h.ranges[name], fmt.Sprintf("%d-%d", start, end))
		h.mu.Unlock()
	}
	w.Header().Set("Content-Length", strconv.FormatInt(end-start+1, 10))
	w.Header().Set("Accept-Ranges", "bytes")
	if r.Method == http.MethodHead {
		w.WriteHeader(status)
		return
	}
	h.mu.Lock()
	gate := h.gate
	cut, doCut := h.cutAfter[name]
	doCut = doCut && cut >= start && cut <= end
	if doCut {
		delete(h.cutAfter, name)
		cut -= start
	}
	stallOff, doStall := h.stallAt[name]
	doStall = doStall && stallOff >= start && stallOff <= end
	if doStall {
		delete(h.stallAt, name)
		stallOff -= start
	}
	body := data[start : end+1]
	if h.corruptNext[name] > 0 && start == 0 {
		h.corruptNext[name]--
		body = append([]byte(nil), body...)
		body[len(body)/2] ^= 0x5a
	}
	h.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-time.After(10 * time.Second):
		}
	}
	w.WriteHeader(status)
	if doStall {
		n, _ := w.Write(body[:stallOff])
		h.count(name, n)
		w.(http.Flusher).Flush()
		select { // silent until the client gives up on this connection
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
		panic(http.ErrAbortHandler)
	}
	if doCut && cut < int64(len(body)) {
		n, _ := w.Write(body[:cut])
		h.count(name, n)
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler) // closes the connection mid-body
	}
	n, _ := w.Write(body)
	h.count(name, n)
}

func (h *fakeHub) count(name string, n int) {
	h.mu.Lock()
	h.served[name] += int64(n)
	h.mu.Unlock()
}

func (h *fakeHub) servedBytes(name string) int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.served[name]
}

func randBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}
