package config

import (
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strings"

	"github.com/exo-pd/exo-pd/internal/modelinfo"
)

// SplitInput is what a pipeline split needs: the model's facts, the stage
// hosts in order, how to share the layers and what each host can hold.
type SplitInput struct {
	Facts *modelinfo.Facts
	Hosts []string
	// Share[i] weighs stage i's part of the load (weights and KV): layers
	// are split so that each stage's load is in proportion to it. Nil: an
	// even split.
	Share []int64
	// Limit[i] is what host i can hold in bytes (0: unknown, not checked).
	Limit []int64
	// Layers fixes the split by hand (layer counts per stage); nil: split
	// by Share.
	Layers []int
	// Context is the tokens of KV each stage reserves per attention layer.
	Context int
}

// fixedBytes is what stage s of n holds besides its layers: the embedding
// on the first, the final norm and LM head on the last (the embedding
// again when the head is tied to it).
func fixedBytes(f *modelinfo.Facts, s, n int) int64 {
	var b int64
	if s == 0 {
		b += f.EmbedBytes
	}
	if s == n-1 {
		b += f.HeadBytes + f.NormBytes
		if f.Tied {
			b += f.EmbedBytes
		}
	}
	return b
}

// kv is layer's KV reserve: its cached positions (the context, a sliding
// window's worth, none for a recurrent layer) × its bytes per position.
func (in SplitInput) kv(layer int) int64 {
	return in.Facts.KVBytesPerTokenPerLayer() * int64(in.Facts.KVTokens(layer, in.Context))
}

// stage fills a stage's byte estimates for layers [a, b).
func (in SplitInput) stage(s, a, b int) Stage {
	st := Stage{Host: in.Hosts[s], Start: a, End: b}
	st.WeightBytes = fixedBytes(in.Facts, s, len(in.Hosts)) + in.Facts.LayerRangeBytes(a, b)
	for i := a; i < b; i++ {
		st.KVBytes += in.kv(i)
	}
	return st
}

// GiB formats bytes in GiB with two decimals, or in MiB, KiB or bytes
// below one GiB, MiB or KiB.
func GiB(b int64) string {
	switch {
	case b >= 1<<30 || b <= -1<<30:
		return fmt.Sprintf("%.2f GiB", float64(b)/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.2f MiB", float64(b)/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(b)/(1<<10))
	}
	return fmt.Sprintf("%d B", b)
}

// Split places a pipeline: stages in host order, layers by hand or in
// proportion to Share; refused when a stage needs more than its Limit (the
// error names the host, the bytes short and what would fit).
func Split(in SplitInput) ([]Stage, error) {
	f, n := in.Facts, len(in.Hosts)
	if n < 2 {
		return nil, fmt.Errorf("a pipeline needs at least 2 stages, got %d", n)
	}
	if f.Layers < n {
		return nil, fmt.Errorf("the model has %d layers, fewer than the %d stages", f.Layers, n)
	}
	bounds := make([]int, n+1)
	bounds[n] = f.Layers
	auto := in.splitByShare()
	if in.Layers != nil {
		sum := 0
		for _, c := range in.Layers {
			sum += c
		}
		if sum != f.Layers {
			return nil, fmt.Errorf("layers sum to %d but the model has %d layers (a split by memory would be %s)", sum, f.Layers, countsString(auto))
		}
		for s, c := range in.Layers {
			bounds[s+1] = bounds[s] + c
		}
	} else {
		copy(bounds, auto)
	}
	stages := make([]Stage, n)
	for s := range stages {
		stages[s] = in.stage(s, bounds[s], bounds[s+1])
	}
	var short []string
	for s, st := range stages {
		if s >= len(in.Limit) || in.Limit[s] <= 0 || st.WeightBytes+st.KVBytes <= in.Limit[s] {
			continue
		}
		need := st.WeightBytes + st.KVBytes
		// What would fit: the most layers this stage could hold from its
		// first layer on, with its fixed weights.
		fit, load := 0, fixedBytes(f, s, n)
		for i := st.Start; i < f.Layers && load+f.LayerBytes[i]+in.kv(i) <= in.Limit[s]; i++ {
			load += f.LayerBytes[i] + in.kv(i)
			fit++
		}
		short = append(short, fmt.Sprintf("host %s (stage %d, layers %d:%d) needs %s (weights %s + KV reserve %s for %d tokens) but has %s: %s (%d bytes) short; it holds at most %d of those layers",
			st.Host, s, st.Start, st.End, GiB(need), GiB(st.WeightBytes), GiB(st.KVBytes), in.Context, GiB(in.Limit[s]), GiB(need-in.Limit[s]), need-in.Limit[s], fit))
	}
	if len(short) > 0 {
		var total, have int64
		known := true
		for s, st := range stages {
			total += st.WeightBytes + st.KVBytes
			if s < len(in.Limit) && in.Limit[s] > 0 {
				have += in.Limit[s]
			} else {
				known = false
			}
		}
		msg := "placement does not fit: " + strings.Join(short, "; ")
		switch {
		case known && total > have:
			msg += fmt.Sprintf("; the model needs %s in all and the hosts give %s: add a host or memory, or use a smaller quantization", GiB(total), GiB(have))
		case in.Layers != nil:
			msg += "; a split by memory would be layers = " + countsString(auto)
		}
		return nil, errors.New(msg)
	}
	return stages, nil
}

// splitByShare returns stage boundaries (n+1 of them) that give each stage
// a load (fixed weights, layers and their KV) in proportion to its share,
// every stage at least one layer.
func (in SplitInput) splitByShare() []int {
	f, n := in.Facts, len(in.Hosts)
	cost := make([]float64, f.Layers+1) // prefix sums
	for i := 0; i < f.Layers; i++ {
		cost[i+1] = cost[i] + float64(f.LayerBytes[i]+in.kv(i))
	}
	total := cost[f.Layers]
	var shareSum float64
	share := make([]float64, n)
	for s := range share {
		share[s] = 1
		if in.Share != nil && s < len(in.Share) && in.Share[s] > 0 {
			share[s] = float64(in.Share[s])
		}
		shareSum += share[s]
		total += float64(fixedBytes(f, s, n))
	}
	bounds := make([]int, n+1)
	bounds[n] = f.Layers
	var target float64
	for s := 0; s < n-1; s++ {
		target += total*share[s]/shareSum - float64(fixedBytes(f, s, n))
		lo, hi := bounds[s]+1, f.Layers-(n-1-s)
		best, bestD := lo, math.Inf(1)
		for k := lo; k <= hi; k++ {
			if d := math.Abs(cost[k] - target); d < bestD {
				best, bestD = k, d
			}
		}
		bounds[s+1] = best
	}
	return bounds
}

func countsString(bounds []int) string {
	parts := make([]string, len(bounds)-1)
	for i := range parts {
		parts[i] = fmt.Sprint(bounds[i+1] - bounds[i])
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// Where a stage host's memory for a placement came from (StageMemory.Source).
const (
	// MemFile: the host's memory_gib.
	MemFile = "file"
	// MemReported: the physical memory the host's supervisor reported
	// (this host's own reading included), as UsableBytes counts it.
	MemReported = "reported"
	// MemUnknown: neither (the host could not tell, or nobody asked it:
	// `exo config check` asks no peer). A split by memory with an unknown
	// host is even.
	MemUnknown = "unknown"
	// MemWaiting: the host's supervisor has not reported yet; the
	// supervisors start no stage of the pipeline until it has.
	MemWaiting = "waiting"
)

// HostMemory is what a host's supervisor reported of its memory: its total
// physical memory in bytes (stable, not what is free), or why it cannot
// tell.
type HostMemory struct {
	Total int64  `json:"total_bytes,omitempty"`
	Err   string `json:"error,omitempty"`
}

// StageMemory is the memory placement counted for one stage host.
type StageMemory struct {
	Host   string `json:"host"`
	Source string `json:"source"` // MemFile, MemReported, MemUnknown or MemWaiting
	// Bytes is what the split weighs and checks the stage against (0
	// when unknown); Reported the physical memory the host reported.
	Bytes    int64  `json:"bytes,omitempty"`
	Reported int64  `json:"reported_bytes,omitempty"`
	Why      string `json:"why,omitempty"` // MemUnknown: why
}

// OSReserveGiB bounds the reserve UsableBytes leaves to the system.
const OSReserveGiB = 8

// UsableBytes is what placement counts of a host's reported physical
// memory: whole GiB, rounded down (readings that differ by a few MiB, as
// two kernels' MemTotal of equal machines do, give equal splits), less a
// reserve for the system of a quarter of that, at most OSReserveGiB. 0:
// under 1 GiB, counted as unknown.
func UsableBytes(total int64) int64 {
	g := total >> 30
	return (g - min(OSReserveGiB, g/4)) << 30
}

// PlaceOptions say what Place knows of the hosts' memory.
type PlaceOptions struct {
	// LocalHost is the host Place runs on.
	LocalHost string
	// Reported holds what each host's supervisor reported of its memory,
	// by host name (this host's own reading too). A host absent has not
	// reported.
	Reported map[string]HostMemory
	// Wait: a pipeline split by memory with a stage host that has neither
	// memory_gib nor a report is left unplaced (Placement.Waiting names
	// those hosts; no stage of it runs) until every one has reported, so
	// that every supervisor computes the same split. False (config check,
	// doctor: they ask no peer): such a host counts as unknown.
	Wait bool
}

// memory resolves a stage host's memory from the file and the reports.
func (c *Config) memory(host string, o PlaceOptions) StageMemory {
	m := StageMemory{Host: host}
	if h := c.Hosts[host]; h != nil && h.MemoryGiB != nil {
		m.Source, m.Bytes = MemFile, int64(*h.MemoryGiB*(1<<30))
		return m
	}
	r, ok := o.Reported[host]
	switch {
	case ok && r.Total > 0 && UsableBytes(r.Total) > 0:
		m.Source, m.Bytes, m.Reported = MemReported, UsableBytes(r.Total), r.Total
	case ok && r.Total > 0:
		m.Source, m.Reported, m.Why = MemUnknown, r.Total, "reported under 1 GiB"
	case ok:
		m.Source, m.Why = MemUnknown, "its supervisor cannot tell: "+r.Err
	case o.Wait:
		m.Source, m.Why = MemWaiting, "its supervisor has not reported its memory yet"
	default:
		m.Source, m.Why = MemUnknown, "not asked here: its supervisor reports it at run time; memory_gib fixes it"
	}
	return m
}

// Placement is how one model's role is placed, as Place found it.
type Placement struct {
	Model string   `json:"model"`
	Role  string   `json:"role"`
	Shard string   `json:"shard"`
	Hosts []string `json:"hosts"` // this group's hosts
	// Group is the pipeline group's index and Groups their number, when
	// the role has groups (decode.groups); 0 and 0 otherwise.
	Group  int `json:"group"`
	Groups int `json:"groups,omitempty"`
	// Stages is nil when the split is not known on this host (Note says
	// why); sizes are 0 when the model's facts were not available.
	Stages  []Stage `json:"stages"`
	Context int     `json:"context,omitempty"`
	Note    string  `json:"note,omitempty"`
	// Ranks is how many tensor ranks each stage has (decode.tensor; 0: one
	// host per stage): stage s's hosts are Hosts[s·Ranks : (s+1)·Ranks],
	// its Stage.Host the first, and each rank holds 1/Ranks of the
	// stage's weights and KV reserve.
	Ranks int `json:"ranks,omitempty"`
	// Memory is each stage host's memory as the split by memory counted
	// it (nil for a split by hand or without the model's facts).
	Memory []StageMemory `json:"memory,omitempty"`
	// Waiting names the stage hosts whose memory the split waits for
	// (PlaceOptions.Wait); Stages is then nil.
	Waiting []string `json:"waiting,omitempty"`
}

// FactsFunc returns a model source's facts; an error wrapping
// modelinfo.ErrNotLocal means the model is not on this machine.
type FactsFunc func(source string) (*modelinfo.Facts, error)

// Place is PlaceWith knowing localHost's physical memory (localMem; 0:
// unknown) and no other host's: what `exo config check` and `exo doctor`
// use, asking no peer.
func (c *Config) Place(facts FactsFunc, localHost string, localMem int64) ([]Placement, error) {
	o := PlaceOptions{LocalHost: localHost, Reported: map[string]HostMemory{}}
	if localMem > 0 {
		o.Reported[localHost] = HostMemory{Total: localMem}
	} else {
		o.Reported[localHost] = HostMemory{Err: "this host's memory is unknown"}
	}
	return c.PlaceWith(facts, o)
}

// PlaceWith decides every pipeline's split from the model's facts and the
// hosts' memory, and refuses what cannot run: a split that does not fit,
// layers that do not sum to the model's, a tensor group whose size does not
// divide the model's heads or MLP widths or whose ranks do not fit. Errors
// carry the decode/prefill key's file:line:column.
//
// A stage host's memory is memory_gib, else UsableBytes of the physical
// memory its supervisor reported (o.Reported), else unknown; the split is
// by hand (layers), else in proportion to those memories, else (a host
// unknown) even. Every input is the file, the model and the reports, which
// every supervisor gets alike, so every supervisor computes the same split.
// A stage is checked against its host's memory where that is known. The
// result is also kept in c (Placements).
func (c *Config) PlaceWith(facts FactsFunc, o PlaceOptions) ([]Placement, error) {
	var out []Placement
	var errs Errors
	bad := func(p Pos, format string, args ...any) {
		errs = append(errs, &Error{c.Path, p, fmt.Sprintf(format, args...)})
	}
	for i, m := range c.Models {
		for _, rr := range []struct {
			role string
			r    *Role
		}{{Decode, m.Decode}, {Prefill, m.Prefill}} {
			r := rr.r
			if r == nil || (r.Shard != ShardPipeline && r.Shard != ShardTensor) {
				continue
			}
			key := c.at("models", i, rr.role)
			pl := Placement{Model: m.Name, Role: rr.role, Shard: r.Shard, Hosts: r.Hosts}
			if r.StageRanks() > 1 {
				pl.Ranks = r.StageRanks()
			}
			f, ferr := facts(r.Source)
			// Only a split by memory cannot do without the facts; the rest
			// runs and the runners check the model at load.
			if ferr != nil && !errors.Is(ferr, modelinfo.ErrNotLocal) && r.Shard == ShardPipeline && r.Layers == nil {
				bad(key, "model %s: %s: cannot read the model's facts for placement: %v", m.Name, rr.role, ferr)
				continue
			}
			if r.Shard == ShardTensor {
				if f != nil {
					if err := f.TensorCheck(len(r.Hosts)); err != nil {
						bad(c.at("models", i, rr.role, "hosts"), "model %s: %s.shard \"tensor\": %v", m.Name, rr.role, err)
						continue
					}
				}
				if rr.role == Prefill && f != nil && f.LinearKeyHeads > 0 {
					bad(c.at("models", i, rr.role, "shard"), "model %s: prefill.shard \"tensor\" on a model with recurrent (Gated DeltaNet) layers is not supported (their state splits by key heads, which no KV head range names: leave prefill's shard out)", m.Name)
					continue
				}
				// Beside a decode pipeline each stage (or each rank of a
				// tensor stage) asks every prefill rank holding some of its
				// KV heads for its layers, and assembles them.
				if f == nil {
					pl.Note = "ranks hold 1/" + fmt.Sprint(len(r.Hosts)) + " of every layer; the model's facts are not readable here, so the split is checked by the runners at load (" + ferr.Error() + ")"
					out = append(out, pl)
					continue
				}
				pl.Context = f.MaxContext
				if err := c.tensorFit(f, r, o, &pl); err != nil {
					bad(key, "model %s: %s: %v", m.Name, rr.role, err)
					continue
				}
				out = append(out, pl)
				continue
			}
			if m0name, m := m.Name, r.StageRanks(); m > 1 && f != nil {
				// Every stage is a tensor group of m ranks: the heads and
				// MLP widths must split m ways.
				if err := f.TensorCheck(m); err != nil {
					bad(c.at("models", i, rr.role, "tensor"), "model %s: %s.tensor = %d: %v", m0name, rr.role, m, err)
					continue
				}
			}
			for g, hosts := range r.StageGroups() {
				pl := pl
				pl.Hosts = hosts
				what := rr.role
				if r.Groups != nil {
					pl.Group, pl.Groups = g, len(r.Groups)
					what = fmt.Sprintf("%s group %d", rr.role, g)
				}
				p, err := c.placeGroup(f, ferr, m.Name, rr.role, r, g, hosts, o, pl)
				if err != nil {
					bad(key, "model %s: %s: %v", m.Name, what, err)
					continue
				}
				out = append(out, p)
				if rr.role == Prefill && g > 0 {
					// Decode takes every group's stage i as replicas of
					// one layer range (plan.go): the groups must split alike.
					a, b := groupString(c.StageGroup(m.Name, Prefill, 0)), groupString(c.StageGroup(m.Name, Prefill, g))
					if a != "" && b != "" && a != b {
						c.setStages(m.Name, Prefill, g, nil) // group g does not run
						bad(key, "model %s: %s splits the layers %s but group 0 %s: decode takes every prefill group's stage i as a replica of one layer range, so the groups must split alike (set prefill.layers, or give the groups alike hosts)", m.Name, what, b, a)
					}
				}
			}
		}
	}
	c.placed = out
	if len(errs) > 0 {
		sort.SliceStable(errs, func(i, j int) bool {
			a, b := errs[i].Pos, errs[j].Pos
			return a.Line < b.Line || a.Line == b.Line && a.Col < b.Col
		})
		return out, errs
	}
	return out, nil
}

// placeGroup splits one pipeline group (hosts, group g of r's) from the
// model's facts f (nil: not readable here, ferr says why) and the hosts'
// memory, keeping its stages in c.
func (c *Config) placeGroup(f *modelinfo.Facts, ferr error, model, role string, r *Role, g int, hosts []string, o PlaceOptions, pl Placement) (Placement, error) {
	if f == nil {
		pl.Stages = c.StageGroup(model, role, g)
		if pl.Stages != nil {
			pl.Note = "split by hand; the model's facts are not readable here, so its layer count and sizes are not checked (" + ferr.Error() + ")"
		} else {
			pl.Note = "placement is decided at start-up on the stage hosts, from the model's files (not in this host's store: " + ferr.Error() + "); a stage host without them runs no stage: pull the model there or set layers = [...]"
			if role == Prefill {
				pl.Note += "; a decode host that cannot split it passes its runners no --prefill (they prefill locally)"
			}
		}
		return pl, nil
	}
	leads, ranks := r.StageLeads(hosts), r.StageRanks()
	in := SplitInput{Facts: f, Hosts: leads, Layers: r.Layers, Context: f.MaxContext}
	pl.Context = f.MaxContext
	in.Share = make([]int64, len(leads))
	in.Limit = make([]int64, len(leads))
	if ranks > 1 {
		pl.Note = fmt.Sprintf("each stage is a tensor group of %d ranks (its hosts in order, rank 0 first): a rank holds 1/%d of its stage's weights and KV reserve, and a stage counts %d × the least memory of its ranks", ranks, ranks, ranks)
	}
	even := false
	for s, hn := range hosts {
		sm := c.memory(hn, o)
		if ranks > 1 { // a stage: its ranks' least memory, times their count
			st := s / ranks
			if s%ranks == 0 || sm.Bytes < in.Share[st]/int64(ranks) {
				in.Share[st], in.Limit[st] = sm.Bytes*int64(ranks), sm.Bytes*int64(ranks)
			}
		} else {
			in.Share[s], in.Limit[s] = sm.Bytes, sm.Bytes
		}
		switch sm.Source {
		case MemUnknown:
			even = true
		case MemWaiting:
			pl.Waiting = append(pl.Waiting, hn)
		}
		if r.Layers == nil {
			pl.Memory = append(pl.Memory, sm)
		}
	}
	if r.Layers != nil {
		pl.Waiting = nil // a split by hand waits for no one
	}
	if pl.Waiting != nil {
		c.setStages(model, role, g, nil)
		pl.Note = "waiting for " + strings.Join(pl.Waiting, ", ") + " to report its memory (no memory_gib in the file): no stage runs until every stage host has reported, so that every supervisor splits alike"
		return pl, nil
	}
	if even {
		in.Share = nil // a host's memory unknown: even
	}
	st, err := Split(in)
	if err != nil {
		return pl, err
	}
	c.setStages(model, role, g, st)
	pl.Stages = st
	return pl, nil
}

// Placements returns what the last Place or PlaceWith on c found (nil
// before either ran).
func (c *Config) Placements() []Placement { return slices.Clone(c.placed) }

// tensorFit fills a tensor group's per-rank estimates (1/N of the weights
// and of the KV reserve: every rank holds its share of every layer and of
// the KV heads) and refuses ranks whose host cannot hold them.
func (c *Config) tensorFit(f *modelinfo.Facts, r *Role, o PlaceOptions, pl *Placement) error {
	n := int64(len(r.Hosts))
	kv := f.KVBytes(0, f.Layers, f.MaxContext)
	var short []string
	for _, hn := range r.Hosts {
		st := Stage{Host: hn, Start: 0, End: f.Layers, WeightBytes: f.TotalBytes() / n, KVBytes: kv / n}
		pl.Stages = append(pl.Stages, st)
		sm := c.memory(hn, o)
		pl.Memory = append(pl.Memory, sm)
		limit := sm.Bytes
		if need := st.WeightBytes + st.KVBytes; limit > 0 && need > limit {
			short = append(short, fmt.Sprintf("host %s needs %s (1/%d of the weights %s + of the KV reserve %s for %d tokens) but has %s: %s (%d bytes) short",
				hn, GiB(need), n, GiB(st.WeightBytes), GiB(st.KVBytes), f.MaxContext, GiB(limit), GiB(need-limit), need-limit))
		}
	}
	if short != nil {
		return fmt.Errorf("tensor ranks do not fit: %s; more ranks (a count TensorCheck accepts) or more memory would", strings.Join(short, "; "))
	}
	return nil
}

// WritePlacement prints each pipeline's stages: host, layer range, weight
// GiB and KV reserve, and which memory each host's share came from (what
// `exo config check` shows).
func WritePlacement(w io.Writer, ps []Placement) {
	for _, p := range ps {
		fmt.Fprintf(w, "\nmodel %s %s: %s", p.Model, p.Role, p.Shard)
		if p.Groups > 0 {
			fmt.Fprintf(w, " group %d of %d", p.Group, p.Groups)
		}
		fmt.Fprintf(w, " over %d hosts (%s)", len(p.Hosts), strings.Join(p.Hosts, ", "))
		if p.Context > 0 {
			fmt.Fprintf(w, ", KV reserved for %d tokens", p.Context)
		}
		fmt.Fprintln(w)
		if p.Note != "" {
			fmt.Fprintf(w, "  %s\n", p.Note)
		}
		if len(p.Memory) > 0 {
			fmt.Fprintf(w, "  %s\n", MemoryLine(p))
		}
		unit := "stage"
		if p.Shard == ShardTensor {
			unit = "rank "
		}
		for s, st := range p.Stages {
			if p.Ranks > 1 { // a stage of tensor ranks: each holds 1/Ranks
				fmt.Fprintf(w, "  %s %d  hosts %s  layers %d:%d", unit, s, StageHosts(p, s), st.Start, st.End)
				if st.WeightBytes > 0 {
					r := int64(p.Ranks)
					fmt.Fprintf(w, "  per rank: weights %s  KV reserve %s", GiB(st.WeightBytes/r), GiB(st.KVBytes/r))
				}
				fmt.Fprintln(w)
				continue
			}
			fmt.Fprintf(w, "  %s %d  host %-12s layers %3d:%-3d", unit, s, st.Host, st.Start, st.End)
			if st.WeightBytes > 0 {
				fmt.Fprintf(w, "  weights %10s  KV reserve %10s", GiB(st.WeightBytes), GiB(st.KVBytes))
			}
			fmt.Fprintln(w)
		}
	}
}

// StageHosts names stage s's hosts of p: its host, or with Ranks its
// ranks' hosts in rank order ("a+b").
func StageHosts(p Placement, s int) string {
	if p.Ranks <= 1 || (s+1)*p.Ranks > len(p.Hosts) {
		return p.Stages[s].Host
	}
	return strings.Join(p.Hosts[s*p.Ranks:(s+1)*p.Ranks], "+")
}

// MemoryLine says which memory each host of p counted and what the split
// followed.
func MemoryLine(p Placement) string {
	var parts []string
	even := false
	for _, m := range p.Memory {
		switch m.Source {
		case MemFile:
			parts = append(parts, fmt.Sprintf("%s %s (memory_gib)", m.Host, GiB(m.Bytes)))
		case MemReported:
			parts = append(parts, fmt.Sprintf("%s %s (reported: %s physical)", m.Host, GiB(m.Bytes), GiB(m.Reported)))
		default:
			even = even || m.Source == MemUnknown
			parts = append(parts, fmt.Sprintf("%s %s (%s)", m.Host, m.Source, m.Why))
		}
	}
	line := "memory: " + strings.Join(parts, ", ")
	switch {
	case p.Shard == ShardTensor:
		line += "; each rank is checked against its host's where known"
	case p.Waiting != nil:
		line += "; split when every stage host has reported"
	case p.Ranks > 1 && !even:
		line += fmt.Sprintf("; layers split in proportion to %d × each stage's least", p.Ranks)
	case even:
		line += "; a host's memory is unknown, so the split is even"
	default:
		line += "; layers split in proportion"
	}
	return line
}
