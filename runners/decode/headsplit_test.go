package decode_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/internal/testutil"
	"github.com/exo-pd/exo-pd/runners/decode"
	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
	"github.com/exo-pd/exo-pd/runners/kvwire"
	"github.com/exo-pd/exo-pd/runners/kvwire/kvwiretest"
	"github.com/exo-pd/exo-pd/runners/prefill"
)

// TestParsePrefillHeads: ADDR#H0:H1 (or ADDR#I/N) entries name the ranks
// of a tensor-parallel prefill group (replicas share a range, parts sorted
// by head); mixing kinds or forms, groups of different sizes, overlapping
// or malformed ranges are refused.
func TestParsePrefillHeads(t *testing.T) {
	addrs, parts, err := decode.ParsePrefillEndpoints([]string{"b:2#2:4", "a:1#0:2", "c:3#2:4"})
	if err != nil {
		t.Fatal(err)
	}
	want := []decode.PrefillPart{{Start: 0, End: 2, Endpoints: []string{"a:1"}, Heads: true}, {Start: 2, End: 4, Endpoints: []string{"b:2", "c:3"}, Heads: true}}
	if !reflect.DeepEqual(parts, want) || !reflect.DeepEqual(addrs, []string{"b:2", "a:1", "c:3"}) {
		t.Fatalf("parts %+v addrs %v", parts, addrs)
	}
	_, parts, err = decode.ParsePrefillEndpoints([]string{"a:1#0/2", "b:2#1/2"})
	want = []decode.PrefillPart{{Start: 0, End: 1, Endpoints: []string{"a:1"}, Heads: true, Ranks: 2}, {Start: 1, End: 2, Endpoints: []string{"b:2"}, Heads: true, Ranks: 2}}
	if err != nil || !reflect.DeepEqual(parts, want) {
		t.Fatalf("ranks: %+v %v", parts, err)
	}
	for _, l := range [][]string{{"a:1#0/2", "b:2#1/3"}, {"a:1#0/2", "b:2#1:2"}, {"a:1#2/2"}, {"a:1#0/2", "b:2#0/2", "c:3#0:1"},
		{"a:1#0:2", "b:2@2:4"}, {"a:1#0:2", "b:2"}, {"a:1", "b:2#0:1"}, {"a:1#0:2", "b:2#1:3"},
		{"a:1#2:2"}, {"a:1#-1:2"}, {"a:1#x"}, {"#0:1"}} {
		if _, _, err := decode.ParsePrefillEndpoints(l); err == nil {
			t.Errorf("%q parsed", l)
		}
	}
}

// TestHeadFill: a whole cache filled in head pieces from two whole
// prefill runners (each asked for half of the KV heads, ADDR#H0:H1, with a
// smaller chunk on one so that the pieces' chunk boundaries differ) holds
// the KV of a local prefill bit for bit; with FP8 on the wire, what one
// FP8 stream of every head gives; a piece whose runner cannot be
// reached fails the fill and leaves the cache at start.
func TestHeadFill(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "llama")
	if err := testmodel.Write(dir, testmodel.Spec{Arch: "llama", Seed: 9, Layers: 2, Heads: 8, KVHeads: 4, MaxPositions: 1024}); err != nil {
		t.Fatal(err)
	}
	m := load(t, dir, engine.LayerRange{})
	serve := func(chunk int) string {
		prod := prefill.New(prefill.Options{Name: "m", Model: m, Chunk: chunk, CacheBlock: 16})
		t.Cleanup(prod.Close)
		return kvwiretest.Serve(t, context.Background(), prod)
	}
	a, b := serve(16), serve(24)
	ctx := t.Context()
	prompt := testmodel.Ramp(75, 11, 29, 500)
	ref := testmodel.LocalPrefill(t, m, prompt[:len(prompt)-1], 16)
	_, parts, err := decode.ParsePrefillEndpoints([]string{a + "#0:2", b + "#2:4"})
	if err != nil {
		t.Fatal(err)
	}
	for _, fp8 := range []bool{false, true} {
		rem := &decode.KVRemote{Client: kvwire.NewClient(kvwire.ClientConfig{}), Name: "m", Model: m, Parts: parts}
		want := ref
		if fp8 {
			// FP8 scales per head and chunk: both pieces from the runner
			// of 16-token chunks, against one FP8 stream of every head.
			_, fparts, err := decode.ParsePrefillEndpoints([]string{a + "#0:2", a + "#2:4"})
			if err != nil {
				t.Fatal(err)
			}
			rem.Parts, rem.WireDType = fparts, kvwire.DTypeF8E4M3
			one := &decode.KVRemote{Client: rem.Client, Name: "m", Model: m, WireDType: kvwire.DTypeF8E4M3,
				Selector: kvwire.NewSelector([]kvwire.Endpoint{{Addr: a}})}
			want = m.NewCache()
			defer want.Free()
			if _, err := one.Prefill(ctx, "fp8-one", prompt, 0, want, nil); err != nil {
				t.Fatal(err)
			}
		}
		c := m.NewCache()
		if _, err := rem.Prefill(ctx, fmt.Sprint("fp8=", fp8), prompt, 0, c, nil); err != nil {
			t.Fatalf("fp8 %v: %v", fp8, err)
		}
		sameLayers(t, fmt.Sprint("fp8 ", fp8), want, c, 0, 2, len(prompt)-1)
		c.Free()
	}
	dead := testutil.Addr(t)
	_, parts, _ = decode.ParsePrefillEndpoints([]string{a + "#0:2", dead + "#2:4"})
	rem := &decode.KVRemote{Client: kvwire.NewClient(kvwire.ClientConfig{ConnectTimeout: time.Second}), Name: "m", Model: m, Parts: parts}
	c := m.NewCache()
	defer c.Free()
	if _, err := rem.Prefill(ctx, "dead", append([]int32{1, 2}, prompt[2:]...), 0, c, nil); err == nil || c.Len() != 0 {
		t.Fatalf("a dead prefill rank: %v, cache holds %d", err, c.Len())
	}
	_, parts, _ = decode.ParsePrefillEndpoints([]string{a + "#0:2"})
	rem.Parts = parts
	if _, err := rem.Prefill(ctx, "gap", prompt, 0, c, nil); !errors.Is(err, kvwire.ErrNoEndpoint) || c.Len() != 0 {
		t.Fatalf("no prefill rank for heads 2:4: %v, cache holds %d", err, c.Len())
	}
}
