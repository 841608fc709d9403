package decode

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/hf"
	"github.com/exo-pd/exo-pd/runners/kvwire"
)

// PrefillPart is one stage of a pipelined prefill model (contract C4):
// the layers [Start, End) its KV port serves and its endpoints (replicas of
// that stage, tried in order); with Heads, one rank of a tensor-parallel
// prefill group: the KV heads [Start, End) its KV port serves
// (headsplit.go), or, with Ranks > 0, rank Start of Ranks (its heads are
// that share of the model's, resolved against the model: ADDR#I/N).
type PrefillPart struct {
	Start, End int
	Endpoints  []string
	Heads      bool
	Ranks      int
}

// ParsePrefillEndpoints splits a decode runner's --prefill list: plain
// ADDR entries (whole prefill runners), ADDR@A:B entries (the stage of a
// prefill pipeline holding layers [A, B)) or ADDR#H0:H1 entries (the rank
// of a tensor-parallel prefill group holding KV heads [H0, H1); ADDR#I/N:
// rank I of N, holding the I-th N-th of the heads, as the supervisor
// writes it), one kind only. Entries of the same range are one stage's (rank's) replicas. It
// returns every address and, for ranges, the parts in order.
func ParsePrefillEndpoints(list []string) (addrs []string, parts []PrefillPart, err error) {
	byRange := map[[2]int]int{}
	kind := byte(0)
	ranks := -1 // #I/N entries' N (0: #H0:H1 entries)
	for _, e := range list {
		addr, rng, staged := strings.Cut(e, "@")
		k := byte(0)
		if staged {
			k = '@'
		} else if addr, rng, staged = strings.Cut(e, "#"); staged {
			k = '#'
		}
		if addr == "" {
			return nil, nil, fmt.Errorf("prefill endpoint %q: no address", e)
		}
		addrs = append(addrs, addr)
		if len(addrs) == 1 {
			kind = k
		} else if k != kind {
			return nil, nil, fmt.Errorf("prefill endpoint %q: every endpoint names its layers (ADDR@A:B), or every one its KV heads (ADDR#H0:H1), or none does", e)
		}
		if !staged {
			continue
		}
		var r hf.LayerRange
		what := "layers"
		n := 0
		if k == '#' && strings.Contains(rng, "/") {
			what = "tensor ranks"
			r.Start, n, err = parseRank(rng)
			r.End = r.Start + 1
		} else if k == '#' {
			what = "kv heads"
			r.Start, r.End, err = parseHeads(rng)
		} else {
			r, err = hf.ParseLayers(rng)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("prefill endpoint %q: %w", e, err)
		}
		if k == '#' {
			if ranks >= 0 && n != ranks {
				return nil, nil, fmt.Errorf("prefill endpoint %q: every endpoint names its KV heads (ADDR#H0:H1) or its rank of the same group (ADDR#I/N)", e)
			}
			ranks = n
		}
		key := [2]int{r.Start, r.End}
		i, ok := byRange[key]
		if !ok {
			for _, p := range parts {
				if r.Start < p.End && p.Start < r.End {
					return nil, nil, fmt.Errorf("prefill endpoint %q: %s %d:%d overlap another's %d:%d", e, what, r.Start, r.End, p.Start, p.End)
				}
			}
			i = len(parts)
			byRange[key] = i
			parts = append(parts, PrefillPart{Start: r.Start, End: r.End, Heads: k == '#', Ranks: n})
		}
		parts[i].Endpoints = append(parts[i].Endpoints, addr)
	}
	for i := 1; i < len(parts); i++ {
		for j := i; j > 0 && parts[j].Start < parts[j-1].Start; j-- {
			parts[j], parts[j-1] = parts[j-1], parts[j]
		}
	}
	return addrs, parts, nil
}

// splitFill fills cache from the prefill stages of r.Parts: one range
// request per stage overlapping the cache's layers, all at once, each
// stage's KV injected straight into its layers of cache; all are committed
// together, or cache goes back to start when any fails.
func (r *KVRemote) splitFill(ctx context.Context, reqID string, prompt []int32, start int, cache engine.KVCache) (RemoteStats, error) {
	x, y := modelLayers(r.Model)
	var mu sync.Mutex // serializes the imports of the parts' streams
	var jobs []PrefillPart
	for _, p := range r.Parts {
		if a, b := max(p.Start, x), min(p.End, y); a < b {
			jobs = append(jobs, PrefillPart{Start: a, End: b, Endpoints: p.Endpoints})
		}
	}
	covered := x
	for _, p := range jobs {
		if p.Start != covered {
			return RemoteStats{}, fmt.Errorf("%w: no prefill stage holds layer %d", kvwire.ErrNoEndpoint, covered)
		}
		covered = p.End
	}
	if covered != y {
		return RemoteStats{}, fmt.Errorf("%w: no prefill stage holds layer %d", kvwire.ErrNoEndpoint, covered)
	}
	fetches := make([]partFetch, len(jobs))
	for i, p := range jobs {
		req, exp := rangeRequest(r.Model, reqID, r.Name, prompt, start, p.Start, p.End)
		req.DType, req.Deadline, req.Streams = r.wireDType(cache), fetchDeadline(r.Deadline), r.Streams
		fetches[i] = partFetch{req: req, exp: exp, endpoints: p.Endpoints, what: fmt.Sprintf("prefill stage %d:%d", p.Start, p.End),
			sink: &partSink{cacheSink: cacheSink{cache: cache, start: start}, off: p.Start - x, mu: &mu}}
	}
	total, end, err := r.fetchParts(ctx, fetches, "prefill stages")
	return total, commitParts(cache, prompt, start, end, err)
}

// partFetch is one request of a fill split over several prefill runners
// (stages by layer range, tensor ranks by KV head range): tried on its
// endpoints in order, the next only when the last failed retryably before
// its stream began.
type partFetch struct {
	req       *kvwire.Request
	exp       *kvwire.Expect
	endpoints []string
	what      string // names it in errors: "prefill stage 0:2"
	sink      partStream
}

// partStream is a part's sink: whether its stream began (KV of it may be
// in the cache: no other replica) and where it ended.
type partStream interface {
	kvwire.Sink
	began() bool
	ended() int
}

// groupLoad is the fills a decode runner has in flight per prefill group.
// A split fill's parts list their replicas group by group in one order
// (the supervisor writes every group's stages or ranks, the groups rotated
// per decode runner: --prefill S1@0:8,S2@8:16,S3@0:8,S4@8:16), so replica
// j of every part is group j. Each fill picks the group with the fewest
// fills in flight (ties: the earliest, the rotation's preference) and asks
// every part there first, the other groups after it in list order as its
// failover; two fills at once from one decode runner so go to different
// groups while there is an idle one.
type groupLoad struct {
	mu       sync.Mutex
	inFlight []int
}

// take picks the group of a fill over groups groups and counts it in
// flight until done is called.
func (g *groupLoad) take(groups int) (group int, done func()) {
	if groups <= 1 {
		return 0, func() {}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for len(g.inFlight) < groups {
		g.inFlight = append(g.inFlight, 0)
	}
	for j := 1; j < groups; j++ {
		if g.inFlight[j] < g.inFlight[group] {
			group = j
		}
	}
	g.inFlight[group]++
	return group, func() {
		g.mu.Lock()
		g.inFlight[group]--
		g.mu.Unlock()
	}
}

// fromGroup is endpoints starting at replica group, the others after it
// in order (wrapping round).
func fromGroup(endpoints []string, group int) []string {
	if len(endpoints) < 2 {
		return endpoints
	}
	g := group % len(endpoints)
	return append(append([]string(nil), endpoints[g:]...), endpoints[:g]...)
}

// fetchParts runs every part at once; the first to fail cancels the others.
// Every part starts at the least loaded prefill group (groupLoad). It
// returns the summed stats, the token the parts ended at, and the first
// failure (or the parts ending at different tokens); the caller commits or
// rolls back. what names the parts in that last error ("prefill stages").
func (r *KVRemote) fetchParts(ctx context.Context, parts []partFetch, what string) (RemoteStats, int, error) {
	type result struct {
		st  RemoteStats
		end int
	}
	groups := 0
	for _, p := range parts {
		groups = max(groups, len(p.endpoints))
	}
	group, done := r.groups.take(groups)
	defer done()
	res := make([]result, len(parts))
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	var errMu sync.Mutex
	var firstErr error
	for i, p := range parts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var last error
			for _, addr := range fromGroup(p.endpoints, group) {
				if r.Breaker != nil && !r.Breaker.Allow(addr) {
					last = fmt.Errorf("%w: %s", errAllOpen, addr)
					continue
				}
				st, err := r.Client.Fetch(cctx, addr, p.req, p.exp, p.sink)
				if r.Breaker != nil && cctx.Err() == nil {
					r.Breaker.Report(addr, st, err)
				}
				res[i].st = RemoteStats{Endpoint: st.Addr, Bytes: st.PayloadBytes, States: st.States, Duration: st.Duration, Wait: st.WireWait}
				if err == nil {
					res[i].end, last = p.sink.ended(), nil
					break
				}
				last = fmt.Errorf("%s at %s: %w", p.what, addr, err)
				if p.sink.began() || !kvwire.Retryable(err) {
					break // some of its KV may be in the cache: no other replica
				}
			}
			if last != nil {
				errMu.Lock()
				if firstErr == nil { // the first to fail; the others were cancelled by it
					firstErr = last
				}
				errMu.Unlock()
				cancel()
			}
		}()
	}
	wg.Wait()
	var total RemoteStats
	first := firstErr
	for _, x := range res {
		total.Bytes += x.st.Bytes
		total.States += x.st.States
		total.Duration = max(total.Duration, x.st.Duration)
		total.Wait = max(total.Wait, x.st.Wait)
		if total.Endpoint != "" {
			total.Endpoint += ","
		}
		total.Endpoint += x.st.Endpoint
		if first == nil && x.end != res[0].end {
			first = fmt.Errorf("%w: %s ended at %d and %d", kvwire.ErrCorrupt, what, res[0].end, x.end)
		}
	}
	return total, res[0].end, first
}

// commitParts commits a split fill's KV up to end, or, when err (or the
// commit) fails, takes cache back to start.
func commitParts(cache engine.KVCache, prompt []int32, start, end int, err error) error {
	if err != nil {
		cache.Truncate(start)
		return err
	}
	if err := cache.Commit(end); err != nil {
		cache.Truncate(start)
		return fmt.Errorf("commit injected KV: %w", err)
	}
	return checkFilled(cache, prompt, start)
}

// partSink injects one prefill stage's stream (its header's layer i is the
// cache's layer off+i) without committing: the caller commits every
// stage's at once.
type partSink struct {
	cacheSink
	off   int
	mu    *sync.Mutex
	begun bool
	end   int
}

func (s *partSink) Begin(h *kvwire.Header) error {
	if err := s.begin(h, s.off, s.cache.Geometry().KVHeads, false); err != nil {
		return err
	}
	s.begun = true
	return nil
}

func (s *partSink) Chunk(layer, tokenStart, tokenCount int, k, v []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cacheSink.Chunk(s.off+layer, tokenStart, tokenCount, k, v)
}

func (s *partSink) State(layer, tokenEnd int, arrays [][]byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cacheSink.State(s.off+layer, tokenEnd, arrays)
}

func (s *partSink) Done(t kvwire.Totals) error {
	s.end = t.TokenEnd
	return nil
}

func (s *partSink) began() bool { return s.begun }
func (s *partSink) ended() int  { return s.end }

// Rollback leaves the staged KV to splitFill, which truncates the whole
// cache once every stage's stream has ended.
func (s *partSink) Rollback() {}
