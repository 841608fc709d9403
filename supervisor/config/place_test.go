package config

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/internal/modelinfo"
)

const gib = int64(1) << 30

// facts is a synthetic model: n layers of 1 GiB, KV 4 KiB per token and
// layer (8 KV heads × 128 × bf16 × K and V).
func facts(n int, embed, head int64, tied bool) *modelinfo.Facts {
	f := &modelinfo.Facts{Layers: n, LayerBytes: make([]int64, n), KVLayer: make([]bool, n), EmbedBytes: embed, HeadBytes: head,
		Tied: tied, Heads: 32, KVHeads: 8, HeadDim: 128, KVElemBytes: 2, Intermediate: 14336, MaxContext: 32768}
	for i := range f.LayerBytes {
		f.LayerBytes[i] = gib
		f.KVLayer[i] = true
	}
	return f
}

func counts(st []Stage) []int {
	var c []int
	for _, s := range st {
		c = append(c, s.End-s.Start)
	}
	return c
}

func TestSplit(t *testing.T) {
	hosts2, hosts3 := []string{"a", "b"}, []string{"a", "b", "c"}
	tests := []struct {
		name string
		in   SplitInput
		want []int
		err  []string // substrings of the refusal
	}{
		{"even", SplitInput{Facts: facts(8, gib/2, gib/2, false), Hosts: hosts2}, []int{4, 4}, nil},
		{"embedding on stage 0 only", SplitInput{Facts: facts(8, 2*gib, 0, false), Hosts: hosts2, Context: 32768}, []int{3, 5}, nil},
		{"tied embedding on both ends", SplitInput{Facts: facts(8, 2*gib, 0, true), Hosts: hosts2, Context: 32768}, []int{4, 4}, nil},
		{"by memory 1:3", SplitInput{Facts: facts(16, 0, 0, false), Hosts: hosts2, Share: []int64{64 * gib, 192 * gib}}, []int{4, 12}, nil},
		{"three stages", SplitInput{Facts: facts(10, 0, 0, false), Hosts: hosts3, Share: []int64{gib, 2 * gib, 2 * gib}}, []int{2, 4, 4}, nil},
		{"every stage a layer", SplitInput{Facts: facts(3, 0, 0, false), Hosts: hosts3, Share: []int64{100 * gib, gib, gib}}, []int{1, 1, 1}, nil},
		{"by hand", SplitInput{Facts: facts(8, 0, 0, false), Hosts: hosts2, Layers: []int{1, 7}, Limit: []int64{2 * gib, 8 * gib}}, []int{1, 7}, nil},
		{"by hand does not sum", SplitInput{Facts: facts(8, 0, 0, false), Hosts: hosts2, Layers: []int{3, 4}}, nil,
			[]string{"layers sum to 7 but the model has 8 layers (a split by memory would be [4, 4])"}},
		{"by hand does not fit", SplitInput{Facts: facts(8, 0, 0, false), Hosts: hosts2, Layers: []int{6, 2}, Limit: []int64{5 * gib, 5 * gib}}, nil,
			[]string{"host a (stage 0, layers 0:6) needs 6.00 GiB (weights 6.00 GiB + KV reserve 0 B for 0 tokens) but has 5.00 GiB: 1.00 GiB (1073741824 bytes) short; it holds at most 5 of those layers",
				"a split by memory would be layers = [4, 4]"}},
		{"too big", SplitInput{Facts: facts(8, gib, gib, false), Hosts: hosts2, Share: []int64{4 * gib, 4 * gib}, Limit: []int64{4 * gib, 4 * gib}}, nil,
			[]string{"host a (stage 0, layers 0:4) needs 5.00 GiB", "1.00 GiB (1073741824 bytes) short; it holds at most 3 of those layers", "host b", "the model needs 10.00 GiB in all and the hosts give 8.00 GiB"}},
		{"KV reserve tips it over", SplitInput{Facts: facts(8, 0, 0, false), Hosts: hosts2, Share: []int64{4 * gib, 4 * gib}, Limit: []int64{4 * gib, 4 * gib}, Context: 32768}, nil,
			[]string{"needs 4.50 GiB (weights 4.00 GiB + KV reserve 512.00 MiB for 32768 tokens) but has 4.00 GiB: 512.00 MiB (536870912 bytes) short; it holds at most 3 of those layers"}},
		{"fits with the KV reserve", SplitInput{Facts: facts(8, 0, 0, false), Hosts: hosts2, Share: []int64{5 * gib, 5 * gib}, Limit: []int64{5 * gib, 5 * gib}, Context: 32768}, []int{4, 4}, nil},
		{"fewer layers than stages", SplitInput{Facts: facts(2, 0, 0, false), Hosts: hosts3}, nil, []string{"the model has 2 layers, fewer than the 3 stages"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, err := Split(tt.in)
			if tt.err != nil {
				if err == nil {
					t.Fatalf("Split = %v, want a refusal", counts(st))
				}
				for _, w := range tt.err {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("refusal %q\nlacks %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(counts(st), tt.want) {
				t.Fatalf("split %v, want %v", counts(st), tt.want)
			}
			for s, x := range st {
				if x.Host != tt.in.Hosts[s] || (s > 0 && x.Start != st[s-1].End) || st[0].Start != 0 || st[len(st)-1].End != tt.in.Facts.Layers {
					t.Fatalf("stages %+v not contiguous in host order", st)
				}
				w := fixedBytes(tt.in.Facts, s, len(st)) + int64(x.End-x.Start)*gib
				if x.WeightBytes != w || x.KVBytes != int64(x.End-x.Start)*4096*int64(tt.in.Context) {
					t.Errorf("stage %d: weights %d KV %d", s, x.WeightBytes, x.KVBytes)
				}
			}
		})
	}
}

func TestPlace(t *testing.T) {
	src := threeHosts + `
[[models]]
name = "big"
source = "org/big"
decode = { hosts = ["a", "b"], shard = "pipeline" }

[[models]]
name = "hand"
source = "org/absent"
decode = { hosts = ["b", "c"], shard = "pipeline", layers = [5, 3] }

[[models]]
name = "auto-absent"
source = "org/absent"
decode = { hosts = ["a", "c"], shard = "pipeline" }
`
	c, err := Parse("f.toml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	lookup := func(src string) (*modelinfo.Facts, error) {
		if src == "org/big" {
			return facts(8, gib, gib, false), nil
		}
		return nil, fmt.Errorf("%s: %w", src, modelinfo.ErrNotLocal)
	}
	ps, err := c.Place(lookup, "a", 64*gib)
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 3 || !slices.Equal(counts(ps[0].Stages), []int{4, 4}) || !slices.Equal(counts(ps[1].Stages), []int{5, 3}) || ps[2].Stages != nil {
		t.Fatalf("placements %+v", ps)
	}
	if !strings.Contains(ps[2].Note, "placement is decided at start-up") || !strings.Contains(ps[1].Note, "split by hand") {
		t.Errorf("notes %q, %q", ps[1].Note, ps[2].Note)
	}
	// The big model's stages run; the absent one's only where split by hand.
	names := func(h string) (n []string) {
		for _, r := range c.Runners(h) {
			n = append(n, r.Name)
		}
		return n
	}
	if got := names("a"); !slices.Equal(got, []string{"big-decode-stage0"}) {
		t.Errorf("host a runs %v", got)
	}
	if got := names("c"); !slices.Equal(got, []string{"hand-decode-stage1"}) {
		t.Errorf("host c runs %v", got)
	}
	var sb strings.Builder
	WritePlacement(&sb, ps)
	for _, w := range []string{"model big decode: pipeline over 2 hosts (a, b), KV reserved for 32768 tokens",
		"stage 0  host a            layers   0:4    weights   5.00 GiB  KV reserve 512.00 MiB",
		"stage 1  host b            layers   4:8    weights   5.00 GiB  KV reserve 512.00 MiB"} {
		if !strings.Contains(sb.String(), w) {
			t.Errorf("table lacks %q:\n%s", w, sb.String())
		}
	}
	// The local host's physical memory is its limit when memory_gib is unset.
	c, _ = Parse("f.toml", []byte(src))
	_, err = c.Place(lookup, "b", 5*gib)
	var es Errors
	if !errors.As(err, &es) || len(es) != 1 || es[0].Pos != (Pos{19, 1}) ||
		!strings.Contains(es[0].Msg, "model big: decode: placement does not fit: host b (stage 1, layers 4:8) needs 5.50 GiB") {
		t.Fatalf("Place on a 5 GiB host b: %v", err)
	}
}

func TestPlaceTensor(t *testing.T) {
	parse := func(extra string) *Config {
		t.Helper()
		c, err := Parse("f.toml", []byte(threeHosts+`
[[models]]
name = "m"
source = "s"
decode = { hosts = ["a", "b"], shard = "tensor" }
`+extra))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	smol := func(string) (*modelinfo.Facts, error) {
		return &modelinfo.Facts{Heads: 9, KVHeads: 3, Intermediate: 1536, Layers: 30, LayerBytes: make([]int64, 30), KVLayer: make([]bool, 30)}, nil
	}
	even := func(string) (*modelinfo.Facts, error) { return facts(8, gib, gib, false), nil }
	errs := func(err error) []string {
		if err == nil {
			return nil
		}
		return strings.Split(err.Error(), "\n")
	}

	// Heads that 2 ranks cannot divide: refused.
	c := parse(`prefill = { hosts = ["a", "c"], shard = "pipeline" }`)
	_, err := c.Place(smol, "a", 0)
	want := []string{
		`f.toml:19:12: model m: decode.shard "tensor": 2 hosts: num_attention_heads 9 is not divisible by 2; num_key_value_heads 3 is not divisible by 2; host counts that would: 3`,
	}
	if !slices.Equal(errs(err), want) {
		t.Errorf("Place: %v\nwant %s", err, strings.Join(want, "\n"))
	}
	// A pipeline prefill beside tensor ranks (it was refused): every rank
	// gets the same --prefill list, each stage's KV port and its layers.
	c = parse(`prefill = { hosts = ["a", "c"], shard = "pipeline" }`)
	if _, err = c.Place(even, "a", 0); err != nil {
		t.Fatalf("tensor decode with a pipeline prefill: %v", err)
	}
	var lists []string
	for _, h := range []string{"a", "b"} {
		for _, r := range c.Runners(h) {
			if r.Role != Decode {
				continue
			}
			lists = append(lists, strings.Join(r.Prefill, ","))
		}
	}
	if len(lists) != 2 || lists[0] != lists[1] || strings.Count(lists[0], "@") != 2 || !strings.Contains(lists[0], "@0:") {
		t.Errorf("tensor ranks beside a 2-stage prefill pipeline got --prefill %q, want the same two ADDR@A:B entries each", lists)
	}
	// With two prefill groups every rank gets the groups in one order (a
	// tensor decode is one replica: its ranks prefer the same group).
	c = parse(`prefill = { groups = [["a", "c"], ["b", "d"]], shard = "pipeline" }

[hosts.d]
address = "127.0.0.5"
backend = "cpu"`)
	if _, err = c.Place(even, "a", 0); err != nil {
		t.Fatalf("tensor decode with two prefill pipeline groups: %v", err)
	}
	lists = nil
	for _, h := range []string{"a", "b"} {
		for _, r := range c.Runners(h) {
			if r.Role == Decode {
				lists = append(lists, strings.Join(r.Prefill, ","))
			}
		}
	}
	if len(lists) != 2 || lists[0] != lists[1] || strings.Count(lists[0], "@") != 4 {
		t.Errorf("tensor ranks beside two prefill pipeline groups got --prefill %q, want the same four ADDR@A:B entries each", lists)
	}
	// Prefill runners beside a tensor decode: every rank gets --prefill.
	c = parse(`prefill = { hosts = ["c"] }`)
	if _, err = c.Place(even, "a", 0); err != nil {
		t.Errorf("tensor with prefill: %v", err)
	}
	for _, h := range []string{"a", "b"} {
		if rs := c.Runners(h); len(rs) != 1 || !slices.Contains(rs[0].Args(), "--prefill") {
			t.Errorf("host %s: %+v, want a rank with --prefill", h, rs)
		}
	}
	// Ranks that fit: each holds half of the weights and of the KV reserve.
	c = parse("")
	ps, err := c.Place(even, "a", 64*gib)
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 1 || len(ps[0].Stages) != 2 || ps[0].Stages[1].WeightBytes != 5*gib || ps[0].Stages[1].KVBytes != gib/2 {
		t.Fatalf("placement %+v", ps)
	}
	var sb strings.Builder
	WritePlacement(&sb, ps)
	if !strings.Contains(sb.String(), "rank  1  host b            layers   0:8    weights   5.00 GiB  KV reserve 512.00 MiB") {
		t.Errorf("table:\n%s", sb.String())
	}
	// This host's memory is its limit (6 GiB physical: 5 GiB usable).
	if _, err = parse("").Place(even, "b", 6*gib); err == nil || !strings.Contains(err.Error(), "f.toml:19:1: model m: decode: tensor ranks do not fit: host b needs 5.50 GiB (1/2 of the weights 5.00 GiB + of the KV reserve 512.00 MiB for 32768 tokens) but has 5.00 GiB: 512.00 MiB (536870912 bytes) short") {
		t.Errorf("tensor on a small host: %v", err)
	}
}

// TestPlaceReportedMemory: a split by memory counts memory_gib, else the
// physical memory the host's supervisor reported (UsableBytes of it), else
// waits for the report (PlaceOptions.Wait) or, unknown, splits evenly.
func TestPlaceReportedMemory(t *testing.T) {
	f16 := func(string) (*modelinfo.Facts, error) { f := facts(16, 0, 0, false); f.MaxContext = 0; return f, nil }
	rep := func(total int64) HostMemory { return HostMemory{Total: total} }
	tests := []struct {
		name     string
		memA     string // memory_gib line for host a, or ""
		reported map[string]HostMemory
		wait     bool
		want     []int // nil: not placed
		waiting  []string
		sources  []string
		line     string // in WritePlacement's memory line
	}{
		{"both reported 1:3", "", map[string]HostMemory{"a": rep(40 * gib), "b": rep(104 * gib)}, true, []int{4, 12}, nil,
			[]string{MemReported, MemReported}, "a 32.00 GiB (reported: 40.00 GiB physical), b 96.00 GiB (reported: 104.00 GiB physical); layers split in proportion"},
		{"a few MiB apart split alike", "", map[string]HostMemory{"a": rep(40*gib + 900<<20), "b": rep(104*gib - 0)}, true, []int{4, 12}, nil,
			[]string{MemReported, MemReported}, ""},
		{"file and reported mix", "memory_gib = 32\n", map[string]HostMemory{"b": rep(104 * gib)}, true, []int{4, 12}, nil,
			[]string{MemFile, MemReported}, "a 32.00 GiB (memory_gib), b 96.00 GiB"},
		{"file wins over the report", "memory_gib = 96\n", map[string]HostMemory{"a": rep(40 * gib), "b": rep(104 * gib)}, true, []int{8, 8}, nil,
			[]string{MemFile, MemReported}, ""},
		{"waits for b", "", map[string]HostMemory{"a": rep(40 * gib)}, true, nil, []string{"b"},
			[]string{MemReported, MemWaiting}, "b waiting (its supervisor has not reported its memory yet); split when every stage host has reported"},
		{"b cannot tell: even", "", map[string]HostMemory{"a": rep(40 * gib), "b": {Err: "memory size unknown on this system"}}, true, []int{8, 8}, nil,
			[]string{MemReported, MemUnknown}, "b unknown (its supervisor cannot tell: memory size unknown on this system); a host's memory is unknown, so the split is even"},
		{"config check asks no peer: even", "", map[string]HostMemory{"a": rep(40 * gib)}, false, []int{8, 8}, nil,
			[]string{MemReported, MemUnknown}, "b unknown (not asked here: its supervisor reports it at run time; memory_gib fixes it)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := strings.Replace(threeHosts, "backend = \"cpu\"\n", "backend = \"cpu\"\n"+tt.memA, 1) + `
[[models]]
name = "m"
source = "s"
decode = { hosts = ["a", "b"], shard = "pipeline" }
`
			c, err := Parse("f.toml", []byte(src))
			if err != nil {
				t.Fatal(err)
			}
			ps, err := c.PlaceWith(f16, PlaceOptions{LocalHost: "a", Reported: tt.reported, Wait: tt.wait})
			if err != nil {
				t.Fatal(err)
			}
			if len(ps) != 1 {
				t.Fatalf("placements %+v", ps)
			}
			p := ps[0]
			if got := counts(p.Stages); !slices.Equal(got, tt.want) {
				t.Errorf("split %v, want %v", got, tt.want)
			}
			if !slices.Equal(p.Waiting, tt.waiting) {
				t.Errorf("waiting %v, want %v", p.Waiting, tt.waiting)
			}
			var src2 []string
			for _, m := range p.Memory {
				src2 = append(src2, m.Source)
			}
			if !slices.Equal(src2, tt.sources) {
				t.Errorf("memory sources %v, want %v", src2, tt.sources)
			}
			// No stage runs while the split waits; once placed, both do.
			var n int
			for _, h := range []string{"a", "b"} {
				n += len(c.Runners(h))
			}
			if want := 2 * min(1, len(tt.want)); n != want {
				t.Errorf("%d stage runners planned, want %d", n, want)
			}
			if !slices.Equal(c.Placements()[0].Waiting, tt.waiting) {
				t.Errorf("Placements() %+v", c.Placements())
			}
			var sb strings.Builder
			WritePlacement(&sb, ps)
			if !strings.Contains(sb.String(), tt.line) {
				t.Errorf("placement text lacks %q:\n%s", tt.line, sb.String())
			}
		})
	}
}

func TestUsableBytes(t *testing.T) {
	for _, tt := range []struct{ total, want int64 }{
		{512 * gib, 504 * gib}, {128 * gib, 120 * gib}, {125*gib + 700<<20, 117 * gib}, {16 * gib, 12 * gib},
		{8 * gib, 6 * gib}, {3 * gib, 3 * gib}, {gib, gib}, {900 << 20, 0},
	} {
		if got := UsableBytes(tt.total); got != tt.want {
			t.Errorf("UsableBytes(%s) = %s, want %s", GiB(tt.total), GiB(got), GiB(tt.want))
		}
	}
}

// TestPlaceGroups: each pipeline group is split on its own hosts' memory,
// and a group that waits for a report does not hold the other back.
func TestPlaceGroups(t *testing.T) {
	src := fourHosts + `
[[models]]
name = "m"
source = "s"
decode = { groups = [["a", "b"], ["c", "d"]], shard = "pipeline" }
`
	c, err := Parse("f.toml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	f16 := func(string) (*modelinfo.Facts, error) { f := facts(16, 0, 0, false); f.MaxContext = 0; return f, nil }
	ps, err := c.PlaceWith(f16, PlaceOptions{LocalHost: "a", Wait: true,
		Reported: map[string]HostMemory{"a": {Total: 40 * gib}, "b": {Total: 104 * gib}, "c": {Total: 40 * gib}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 2 || ps[0].Group != 0 || ps[1].Group != 1 || ps[0].Groups != 2 ||
		!slices.Equal(counts(ps[0].Stages), []int{4, 12}) || ps[1].Stages != nil || !slices.Equal(ps[1].Waiting, []string{"d"}) {
		t.Fatalf("placements %+v", ps)
	}
	for h, want := range map[string]int{"a": 1, "b": 1, "c": 0, "d": 0} {
		if n := len(c.Runners(h)); n != want {
			t.Errorf("host %s runs %d stages, want %d", h, n, want)
		}
	}
	var sb strings.Builder
	WritePlacement(&sb, ps)
	if !strings.Contains(sb.String(), "model m decode: pipeline group 0 of 2 over 2 hosts (a, b)") ||
		!strings.Contains(sb.String(), "model m decode: pipeline group 1 of 2 over 2 hosts (c, d)") {
		t.Errorf("placement text:\n%s", sb.String())
	}
	// Once d reports, group 1 splits on its own memory.
	ps, err = c.PlaceWith(f16, PlaceOptions{LocalHost: "a", Wait: true,
		Reported: map[string]HostMemory{"a": {Total: 40 * gib}, "b": {Total: 104 * gib}, "c": {Total: 104 * gib}, "d": {Total: 40 * gib}}})
	if err != nil || !slices.Equal(counts(ps[1].Stages), []int{12, 4}) || len(c.Runners("d")) != 1 {
		t.Fatalf("placements %+v %v", ps, err)
	}
}

// TestPlacePrefillGroups: decode takes prefill group g's stage i as a
// replica of group 0's, so prefill groups split differently are refused
// (naming both splits) and the odd group does not run.
func TestPlacePrefillGroups(t *testing.T) {
	src := fourHosts + `
[[models]]
name = "m"
source = "s"
decode = { hosts = ["a"] }
prefill = { groups = [["b", "c"], ["d", "a"]], shard = "pipeline" }
`
	c, err := Parse("f.toml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	f16 := func(string) (*modelinfo.Facts, error) { f := facts(16, 0, 0, false); f.MaxContext = 0; return f, nil }
	alike := map[string]HostMemory{"a": {Total: 40 * gib}, "b": {Total: 40 * gib}, "c": {Total: 40 * gib}, "d": {Total: 40 * gib}}
	if _, err := c.PlaceWith(f16, PlaceOptions{LocalHost: "a", Wait: true, Reported: alike}); err != nil {
		t.Fatalf("alike groups: %v", err)
	}
	if n := len(c.Runners("d")); n != 1 {
		t.Errorf("host d runs %d prefill stages, want 1", n)
	}
	unlike := map[string]HostMemory{"a": {Total: 40 * gib}, "b": {Total: 40 * gib}, "c": {Total: 104 * gib}, "d": {Total: 40 * gib}}
	_, err = c.PlaceWith(f16, PlaceOptions{LocalHost: "a", Wait: true, Reported: unlike})
	if err == nil || !strings.Contains(err.Error(), "model m: prefill group 1 splits the layers 0:8,8:16 but group 0 0:4,4:16") {
		t.Fatalf("unlike groups: %v", err)
	}
	if n := len(c.Runners("d")); n != 0 {
		t.Errorf("host d runs %d prefill stages of a group split unlike group 0, want 0", n)
	}
	for _, r := range c.Runners("a") {
		if r.Role == Decode && len(r.Prefill) != 2 {
			t.Errorf("decode --prefill %v, want group 0's stages only", r.Prefill)
		}
	}
}
