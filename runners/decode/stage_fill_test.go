package decode

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"slices"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	_ "github.com/exo-pd/exo-pd/runners/engine/backend" // registers the weight loader
	"github.com/exo-pd/exo-pd/runners/engine/cpu"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
	"github.com/exo-pd/exo-pd/runners/kvwire"
)

// loadDir loads the model in dir on its own cpu backend (closed when the
// test ends), whole or as the pipeline stage of layers r.
func loadDir(t *testing.T, dir string, r engine.LayerRange) *engine.Model {
	t.Helper()
	m, err := engine.Load(context.Background(), dir, cpu.New(2), engine.LoadOptions{Layers: r})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	if r != (engine.LayerRange{}) && m.Stage() != r {
		t.Fatalf("loaded stage %v, asked %v", m.Stage(), r)
	}
	return m
}

// stageShare is the KV payload the layers [a, b) of whole-model cache ref
// (holding end positions) contribute to a stream of [start, end): K and V
// of the positions each attention layer ships (a sliding layer its window
// of end only) and each recurrent layer's state.
func stageShare(t *testing.T, m *engine.Model, ref engine.KVCache, a, b, start, end int) int64 {
	t.Helper()
	info := m.Info()
	var n int64
	for l := a; l < b; l++ {
		if info.Recurrent != nil && info.Recurrent[l] {
			arrays, err := ref.(engine.RecurrentState).ExportState(l)
			if err != nil {
				t.Fatal(err)
			}
			for _, x := range arrays {
				n += int64(len(x))
			}
			continue
		}
		from := start
		if info.Windows != nil && info.Windows[l] > 0 {
			from = max(start, end-info.Windows[l]+1)
		}
		n += 2 * int64(end-from) * int64(info.KVHeads*info.HeadDim*info.CacheDType.Size())
	}
	return n
}

// sameStageKV fails unless stage cache c (the model's layers [a, b)) holds
// exactly, byte for byte, what whole-model cache ref holds for those
// layers: every attention layer's positions (a sliding layer's window)
// and every recurrent layer's state.
func sameStageKV(t *testing.T, m *engine.Model, ref, c engine.KVCache, a, b int) {
	t.Helper()
	info := m.Info()
	n := ref.Len()
	if c.Len() != n {
		t.Fatalf("stage [%d, %d) cache holds %d positions, whole model %d", a, b, c.Len(), n)
	}
	for l := a; l < b; l++ {
		if info.Recurrent != nil && info.Recurrent[l] {
			want, err1 := ref.(engine.RecurrentState).ExportState(l)
			got, err2 := c.(engine.RecurrentState).ExportState(l - a)
			if err1 != nil || err2 != nil || len(got) != len(want) {
				t.Fatalf("layer %d state: %v %v", l, err1, err2)
			}
			for i := range want {
				if !bytes.Equal(got[i], want[i]) {
					t.Fatalf("layer %d (stage layer %d): state array %d differs from the whole model's", l, l-a, i)
				}
			}
			continue
		}
		from := 0
		if info.Windows != nil {
			from = engine.WindowStart(info.Windows[l], n)
		}
		wk, wv, err1 := ref.Export(l, from, n-from)
		gk, gv, err2 := c.Export(l-a, from, n-from)
		if err1 != nil || err2 != nil {
			t.Fatalf("layer %d export [%d, %d): %v %v", l, from, n, err1, err2)
		}
		if !bytes.Equal(gk, wk) || !bytes.Equal(gv, wv) {
			t.Fatalf("layer %d (stage layer %d): KV [%d, %d) differs from the whole model's", l, l-a, from, n)
		}
	}
}

// corruptProxy relays connections to server and flips one payload byte of
// the nth KV frame (Chunk or State) from the server, counting from 1, of
// the first connection; later connections pass untouched.
func corruptProxy(t *testing.T, server string, nth int) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for first := true; ; first = false {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			go relayFlip(conn, server, nth, first)
		}
	}()
	return l.Addr().String()
}

func relayFlip(conn net.Conn, server string, nth int, flip bool) {
	defer conn.Close()
	up, err := net.Dial("tcp", server)
	if err != nil {
		return
	}
	defer up.Close()
	go io.Copy(up, conn)
	if !flip {
		io.Copy(conn, up)
		return
	}
	hello := make([]byte, 40)
	if _, err := io.ReadFull(up, hello); err != nil {
		return
	}
	conn.Write(hello)
	seen := 0
	for {
		hdr := make([]byte, 12)
		if _, err := io.ReadFull(up, hdr); err != nil {
			return
		}
		payload := make([]byte, binary.LittleEndian.Uint32(hdr[4:8]))
		if _, err := io.ReadFull(up, payload); err != nil {
			return
		}
		if typ := hdr[0]; typ == 5 || typ == 6 {
			if seen++; seen == nth {
				payload[len(payload)-1] ^= 0x10 // inside the K/V or state bytes: the CRC catches it
			}
		}
		if _, err := conn.Write(append(hdr, payload...)); err != nil {
			return
		}
	}
}

// TestStageFillEqualsLocalPrefill: the two stages of a pipelined decode
// group (engine.Model loaded with Layers [0, k) and [k, n) of a tiny
// model), each filled by its own range request from one real prefill
// runner (the whole model) over real TCP, hold exactly the KV a
// whole-model local prefill gives for their layers (byte-identical on
// cpu), for a fresh prompt (start_pos 0) and for the next turn of the
// conversation (start_pos > 0), for full-attention, sliding-window
// (gemma3, tied embeddings) and Gated DeltaNet (qwen3_next: State frames;
// its first stage holds only recurrent layers) models. The bytes each
// stage received (the transfer's counters) are exactly its layers' share,
// and the two shares add up to a whole-model fetch's (the second stage's
// transfers striped over two connections); a KVRemote whose model is a
// stage does the same. With the FP8 wire dtype each
// stage's fill succeeds with fewer bytes than its f32 share (at least a
// quarter of it; as many for a stage of recurrent layers only, whose
// states stay f32). A corrupt frame in
// the middle of a stage's stream fails that fill with ErrCorrupt and
// leaves its cache at start_pos; the next fill succeeds.
func TestStageFillEqualsLocalPrefill(t *testing.T) {
	tmp := t.TempDir()
	write := func(name string, spec testmodel.Spec) string {
		dir := filepath.Join(tmp, name)
		if err := testmodel.Write(dir, spec); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	cases := []struct {
		name string
		dir  string
		k    int // the first stage holds [0, k)
	}{
		{"full attention", write("qwen2", testmodel.Spec{Arch: "qwen2", Seed: 11, Layers: 3, MaxPositions: 1024}), 1},
		{"sliding window", write("gemma3", testmodel.Spec{Arch: "gemma3", Seed: 12, Layers: 5, SlidingWindow: 8, Tied: true, MaxPositions: 1024}), 2},
		{"gated deltanet", filepath.Join("..", "engine", "testdata", "reference", "qwen3_next"), 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			const chunk = 16
			whole := loadDir(t, tc.dir, engine.LayerRange{})
			n := whole.Info().Layers
			stages := []*engine.Model{loadDir(t, tc.dir, engine.LayerRange{Start: 0, End: tc.k}), loadDir(t, tc.dir, engine.LayerRange{Start: tc.k, End: n})}
			ranges := [][2]int{{0, tc.k}, {tc.k, n}}
			addr := servePrefill(t, whole, chunk, nil)
			cl := kvwire.NewClient(kvwire.ClientConfig{})
			fills := make([]*StageFill, 2)
			caches := make([]engine.KVCache, 2)
			for i, s := range stages {
				// The last stage's transfers are striped over two
				// connections (PROTOCOL.md §17): ranges and stripes compose.
				fills[i] = &StageFill{Client: cl, Name: "m", Model: s, Streams: i + 1}
				caches[i] = s.NewCache()
				defer caches[i].Free()
			}

			turn1 := make([]int32, 45)
			for i := range turn1 {
				turn1[i] = int32(5 + i*41%400)
			}
			turn2 := append(slices.Clone(turn1), 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38)
			ref := whole.NewCache()
			defer ref.Free()
			start := 0
			for turn, prompt := range [][]int32{turn1, turn2} {
				end := len(prompt) - 1
				// The reference: the whole model's local prefill, in the
				// prefill runner's chunks from where it resumes.
				if err := whole.Prefill(ctx, ref, prompt[ref.Len():end], chunk, nil); err != nil {
					t.Fatal(err)
				}
				var sum int64
				for i := range stages {
					id := fmt.Sprintf("turn%d-stage%d", turn+1, i)
					st, err := fills[i].Fill(ctx, id, caches[i], prompt, start, []string{addr})
					if err != nil {
						t.Fatalf("%s: %v", id, err)
					}
					a, b := ranges[i][0], ranges[i][1]
					sameStageKV(t, whole, ref, caches[i], a, b)
					if share := stageShare(t, whole, ref, a, b, start, end); st.Bytes != share || share == 0 {
						t.Fatalf("%s: received %d payload bytes, its layers' share is %d", id, st.Bytes, share)
					}
					sum += st.Bytes
				}
				// One whole-model fetch of the same positions carries both
				// shares, no more.
				scratch := whole.NewCache()
				if start > 0 {
					if err := whole.Prefill(ctx, scratch, prompt[:start], chunk, nil); err != nil {
						t.Fatal(err)
					}
				}
				wst, err := (&StageFill{Client: cl, Name: "m", Model: whole}).Fill(ctx, "whole", scratch, prompt, scratch.Len(), []string{addr})
				scratch.Free()
				if err != nil || wst.Bytes != sum {
					t.Fatalf("turn %d: whole-model fetch %d bytes (%v), stages %d", turn+1, wst.Bytes, err, sum)
				}
				start = end
			}

			// A decode runner whose model is a stage fills through KVRemote
			// (the router's path) the same way: its range only.
			for i, s := range stages {
				c := s.NewCache()
				st, err := loopbackRemote(s, addr).Prefill(ctx, "kvremote", turn2, 0, c, nil)
				if err != nil {
					t.Fatalf("KVRemote of stage %d: %v", i, err)
				}
				sameStageKV(t, whole, ref, c, ranges[i][0], ranges[i][1])
				if share := stageShare(t, whole, ref, ranges[i][0], ranges[i][1], 0, len(turn2)-1); st.Bytes != share {
					t.Fatalf("KVRemote of stage %d: %d bytes, its share is %d", i, st.Bytes, share)
				}
				c.Free()
			}

			// FP8 on the wire: lossy, so no byte comparison; one byte per
			// element plus a scale per head and chunk (states stay f32).
			for i, s := range stages {
				c := s.NewCache()
				f := *fills[i]
				f.WireDType = kvwire.DTypeF8E4M3
				st, err := f.Fill(ctx, "fp8", c, turn2, 0, []string{addr})
				if err != nil || c.Len() != len(turn2)-1 {
					t.Fatalf("fp8 stage %d: %v, cache %d", i, err, c.Len())
				}
				if full := stageShare(t, whole, ref, ranges[i][0], ranges[i][1], 0, len(turn2)-1); st.Bytes > full || 4*st.Bytes < full || st.Bytes == full && st.States == 0 {
					t.Fatalf("fp8 stage %d: %d bytes for an f32 share of %d", i, st.Bytes, full)
				}
				c.Free()
			}

			// A corrupt frame in the middle of the last stage's stream
			// (the third of its KV frames) for a third turn: that stage
			// is rolled back to start_pos, and a retry fills it.
			turn3 := append(slices.Clone(turn2), 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81)
			bad := corruptProxy(t, addr, 3)
			last := len(stages) - 1
			one := *fills[last]
			one.Streams = 1 // the proxy counts the frames of one connection
			_, err := one.Fill(ctx, "corrupt", caches[last], turn3, start, []string{bad})
			if !errors.Is(err, kvwire.ErrCorrupt) {
				t.Fatalf("corrupt frame: %v, want ErrCorrupt", err)
			}
			if caches[last].Len() != start {
				t.Fatalf("stage cache holds %d positions after a corrupt stream, want start_pos %d", caches[last].Len(), start)
			}
			sameStageKV(t, whole, ref, caches[last], ranges[last][0], ranges[last][1])
			if _, err := fills[last].Fill(ctx, "retry", caches[last], turn3, start, []string{bad}); err != nil {
				t.Fatalf("retry after the corrupt stream: %v", err)
			}
			if err := whole.Prefill(ctx, ref, turn3[ref.Len():len(turn3)-1], chunk, nil); err != nil {
				t.Fatal(err)
			}
			sameStageKV(t, whole, ref, caches[last], ranges[last][0], ranges[last][1])
		})
	}
}
