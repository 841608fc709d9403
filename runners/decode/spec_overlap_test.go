package decode

import (
	"path/filepath"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
)

// specOverlapCases are requests a speculating generation answers with
// drafts and with plain steps between them: specRequests' (greedy with
// logprobs, penalties and bias, a stop sequence, seeded temperature 1, a
// grammar, a forced tool call) and an open prompt that repeats little.
func specOverlapCases() []map[string]any {
	open := []map[string]any{{"role": "user", "content": "seven lighthouse keepers wrote a letter about the sea"}}
	return []map[string]any{
		specBody("greedy", nil),
		specBody("penalties", nil),
		specBody("stop", nil),
		specBody("seeded", nil),
		specBody("grammar", nil),
		specBody("tool call", nil),
		specBody("greedy", map[string]any{"messages": open, "logprobs": false, "top_logprobs": nil, "max_tokens": 50}),
		specBody("seeded", map[string]any{"messages": open, "seed": 5, "temperature": 0.8, "top_k": 9, "max_tokens": 45}),
	}
}

// specCounts sums the journal's drafted tokens accepted and rejected.
func specCounts(s *Server) (accepted, rejected int) {
	for _, r := range s.journal.since(0) {
		accepted, rejected = accepted+r.SpecAccepted, rejected+r.SpecRejected
	}
	return accepted, rejected
}

// TestSpeculativeOverlapped: a speculating generation's plain steps run
// overlapped (forced on the cpu backend), alone (no batcher) and batched
// beside requests that do not speculate, with prompt lookup and with a
// draft model; its answers are those of plain decoding, token for token
// (greedy, seeded, penalties, stop, grammar, tool call, logprobs), and
// its drafted tokens accepted and rejected are those of the serial
// speculative path's (the drafts forced, so that both draft at the same
// places). Drafts proposed while the overlap's next step was in flight
// had their first token checked by that step (specHeld) rather than a
// step computed for nothing; the serial server checks none that way.
func TestSpeculativeOverlapped(t *testing.T) {
	testSpecOverlapped(t, 0, func(dir string, configure func(Text, *Options)) *tinyServer {
		return serveTinyDir(t, dir, configure)
	})
}

// testSpecOverlapped is TestSpeculativeOverlapped on the backend serveOn
// loads the model on; logprobs may differ from the serial path's by tol
// (computed in float32 on a device that picks: MLX).
func testSpecOverlapped(t *testing.T, tol float64, serveOn func(dir string, configure func(Text, *Options)) *tinyServer) {
	dir := filepath.Join(t.TempDir(), "m")
	if err := testmodel.Write(dir, testmodel.Spec{Arch: "llama", Seed: 7, Layers: 2}); err != nil {
		t.Fatal(err)
	}
	draftDir := filepath.Join(t.TempDir(), "draft")
	if err := testmodel.Write(draftDir, testmodel.Spec{Arch: "llama", Seed: 7, Layers: 1}); err != nil {
		t.Fatal(err)
	}
	with := func(mode string, batch int, overlap bool) func(Text, *Options) {
		return func(text Text, o *Options) {
			g := &Grammars{Text: text}
			o.NewConstraint, o.AcceptTools, o.MaxBatch = g.NewConstraint, true, batch
			o.Speculative, o.SpecTokens, o.specForce = mode, 4, true
			if mode == SpecDraft {
				o.Draft = loadDraft(t, draftDir, o.Model, text)
			}
			o.overlap = func(Model) bool { return overlap }
		}
	}
	plain := serveOn(dir, with(SpecOff, 1, false))
	cases := specOverlapCases()
	want := make([]string, len(cases))
	for i, c := range cases {
		want[i] = answerOf(t, plain.url, c)
	}
	for _, mode := range []string{SpecPromptLookup, SpecDraft} {
		t.Run(mode, func(t *testing.T) {
			serial := serveOn(dir, with(mode, 1, false))
			lone := serveOn(dir, with(mode, 1, true))
			if lone.srv.batch != nil || !lone.srv.overlap || serial.srv.overlap {
				t.Fatal("want lone servers, one with overlapped steps")
			}
			for i, c := range cases {
				if got := answerOf(t, serial.url, c); got != want[i] {
					t.Fatalf("case %d: serial speculative answer\n%s\nplain\n%s", i, got, want[i])
				}
				if got := answerOf(t, lone.url, c); !sameAnswer(got, want[i], tol) {
					t.Fatalf("case %d: overlapped speculative answer\n%s\nplain\n%s", i, got, want[i])
				}
			}
			sa, sr := specCounts(serial.srv)
			la, lr := specCounts(lone.srv)
			if sa != la || sr != lr || sa == 0 || sr == 0 {
				t.Fatalf("drafted tokens accepted/rejected: overlapped %d/%d, serial %d/%d (want equal, some of each)", la, lr, sa, sr)
			}
			// A forced draft model drafts at every step: only prompt
			// lookup (which drafts where the history repeats) has plain
			// steps to overlap.
			if n := lone.srv.soloOverlapped.Load(); mode == SpecPromptLookup && n < 20 {
				t.Fatalf("%d overlapped steps of speculating generations", n)
			}
			if (mode == SpecPromptLookup && lone.srv.specHeld.Load() == 0) || serial.srv.specHeld.Load() != 0 {
				t.Fatalf("drafts checked by the step in flight: overlapped %d, serial %d (want some, none)",
					lone.srv.specHeld.Load(), serial.srv.specHeld.Load())
			}
			t.Logf("alone: %d accepted, %d rejected; %d overlapped steps, %d drafts checked in flight, %d steps dropped",
				la, lr, lone.srv.soloOverlapped.Load(), lone.srv.specHeld.Load(), lone.srv.soloDropped.Load())

			// Batched, beside requests that do not speculate: the same
			// answers; the same counts as the serial path's answers of
			// the speculating ones.
			batched := serveOn(dir, with(mode, 8, true))
			mixed := append([]map[string]any(nil), cases...)
			for _, c := range cases[:4] {
				off := map[string]any{"x_exo_speculative": false}
				for k, v := range c {
					off[k] = v
				}
				mixed = append(mixed, off)
			}
			for round := range 2 {
				got := answerAll(t, batched.url, mixed)
				for i := range mixed {
					if !sameAnswer(got[i], want[i%len(cases)], tol) {
						t.Fatalf("round %d, case %d: batched overlapped speculative answer\n%s\nplain\n%s", round, i, got[i], want[i%len(cases)])
					}
				}
			}
			ba, br := specCounts(batched.srv)
			if ba != 2*sa || br != 2*sr {
				t.Fatalf("batched: drafted tokens accepted/rejected %d/%d in two rounds, serial %d/%d in one", ba, br, sa, sr)
			}
			served, _, _, _ := overlapCounts(batched.srv)
			if mode == SpecPromptLookup && (served == 0 || batched.srv.specHeld.Load() == 0) {
				t.Fatalf("batched: %d batches served overlapped, %d drafts checked in flight", served, batched.srv.specHeld.Load())
			}
			t.Logf("batched: %d batches overlapped, %d drafts checked in flight", served, batched.srv.specHeld.Load())
		})
	}
}

// TestHeldProbeCostsNothing: a one-token probe held for the overlapped
// step in flight (hold, then settle with that step's token) costs no
// position and saves no step, so the probes' budget neither charges it
// nor credits its acceptance; its acceptance is learnt and counted as a
// verified draft's.
func TestHeldProbeCostsNothing(t *testing.T) {
	sp := newSpeculator(nil, 0, 8)
	linearSteps(&sp.own, 0.01, 0.85, 12)
	sp.ok[1], sp.fail[1] = 0.02, 0.98 // drafting does not pay: probes only
	d := sp.lookup([]int32{7, 3, 5, 3}, 8)
	if len(d) != 1 || sp.probeDebt <= 0 {
		t.Fatalf("draft %v, probe debt %v: want a probe charged", d, sp.probeDebt)
	}
	sp.hold()
	if !sp.pending() || sp.probeDebt != 0 {
		t.Fatalf("held probe: pending %v, debt %v; want pending, no debt", sp.pending(), sp.probeDebt)
	}
	if sp.settle(d[0]) {
		t.Fatal("a one-token draft settled: nothing is left to verify")
	}
	if sp.probeDebt != 0 || sp.accepted != 1 || sp.rejected != 0 || sp.inFlight != 1 || sp.active() || sp.pending() {
		t.Fatalf("after settling: debt %v, accepted %d, rejected %d, checked in flight %d", sp.probeDebt, sp.accepted, sp.rejected, sp.inFlight)
	}
	// A held draft of three, first token right: the rest is verified
	// after it (rows from the second draft); wrong: all three rejected.
	sp.force = true
	d = sp.lookup([]int32{1, 2, 3, 4, 1}, 3)
	sp.hold()
	if !sp.settle(d[0]) || sp.accepted != 2 || !sp.active() {
		t.Fatalf("first of %v accepted: want the rest verified (accepted %d)", d, sp.accepted)
	}
	if feed := sp.feedFor(nil, d[0]); len(feed) != 3 || feed[1] != d[1] || feed[2] != d[2] {
		t.Fatalf("feed %v after settling %v", feed, d)
	}
	sp.end()
	d = sp.lookup([]int32{1, 2, 3, 4, 1}, 3)
	sp.hold()
	if sp.settle(d[0]+1) || sp.rejected != 2+3 {
		t.Fatalf("first of %v rejected: %d rejected, want 5", d, sp.rejected)
	}
}
