package e2e

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/internal/testutil"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
)

// launchPrefillStage starts stage i of a prefill pipeline (contract C4)
// without waiting for it: its health needs the other stages' links.
func launchPrefillStage(t *testing.T, name, model string, i int, bounds []int, links []string, listen, metrics string, extra ...string) *proc {
	t.Helper()
	N := len(bounds) - 1
	p := &proc{t: t, name: fmt.Sprintf("%s-pstage%d", name, i), done: make(chan struct{}), listen: listen, http: metrics}
	args := []string{"runner", "prefill", "--listen", listen, "--metrics", metrics, "--served-name", "m", "--backend", "cpu", "--offline",
		"--model", model, "--prefill-chunk", "16", "--layers", fmt.Sprintf("%d:%d", bounds[i], bounds[i+1]), "--stage", fmt.Sprintf("%d/%d", i, N),
		"--stage-listen", links[i], "--stage-next", links[(i+1)%N]}
	args = append(args, extra...)
	p.launch(t, args, p.name, 4000)
	return p
}

// TestPrefillPipelineIntoPipeline: a 2-stage prefill pipeline of real
// processes (`exo runner prefill --layers --stage --stage-listen
// --stage-next`) fills a 2-stage decode pipeline split the same way, each
// decode stage asking the prefill stage that holds its layers for them
// (no relay: the prefill stages' KV ports each serve one decode stage),
// and a 3-stage prefill pipeline fills a 2-stage decode pipeline cut
// elsewhere (each decode stage told every prefill stage as ADDR@A:B);
// the answer equals a one-process runner's local prefill at temperature
// 0, for a dense and a sliding-window model: a first turn, a second turn
// whose start the decode side has cached (each stage's fill starts past
// position 0), and short prompts the prefill stages do not cache, where
// the later stage is asked after its computation has ended (this hung).
func TestPrefillPipelineIntoPipeline(t *testing.T) {
	gemma := filepath.Join(t.TempDir(), "gemma3")
	if err := testmodel.Write(gemma, testmodel.Spec{Arch: "gemma3", Seed: 7, Layers: 4, MaxPositions: 4096}); err != nil {
		t.Fatal(err)
	}
	other := tinyModel(t, "other") // 3 layers
	for _, tc := range []struct {
		model  string
		bounds []int // the prefill stages'
		dec    []int // the decode stages' (nil: the prefill's, each told its own prefill stage)
		past   int   // fills that start past 0: a sliding-window cache cannot go back to the template's start
	}{
		{other, []int{0, 1, 3}, nil, 7},
		{gemma, []int{0, 2, 4}, nil, 1},
		// 3 prefill stages into 2 decode stages cut elsewhere: decode
		// stage 0 asks prefill stages 0 and 1, decode stage 1 stage 2.
		{other, []int{0, 1, 2, 3}, []int{0, 2, 3}, 7},
	} {
		name := fmt.Sprintf("%s/%dx%d", filepath.Base(tc.model), len(tc.bounds)-1, len(tc.bounds)-1)
		if tc.dec != nil {
			name = fmt.Sprintf("%s/%dx%d", filepath.Base(tc.model), len(tc.bounds)-1, len(tc.dec)-1)
		}
		t.Run(name, func(t *testing.T) {
			reqs := []pipeReq{{user(words(3, 60)), 12, map[string]any{"temperature": 0, "ignore_eos": true}}}
			one := start(t, "one", "decode", "--model", tc.model)
			want := askAll(t, one.listen, reqs, false)
			// The second turn starts with the first's prompt and answer:
			// the decode side's prefix cache holds its start, so each
			// decode stage asks for the prompt from past position 0.
			turn2 := []pipeReq{{append(append(user(words(3, 60)), msg{Role: "assistant", Content: want[0].Text}), user(words(4, 40))...), 12,
				map[string]any{"temperature": 0, "ignore_eos": true}}}
			want2 := askAll(t, one.listen, turn2, false)
			var short []pipeReq
			for k := range 6 {
				short = append(short, pipeReq{user(fmt.Sprint(k, " ", words(k, 3+k))), 8, map[string]any{"temperature": 0, "ignore_eos": true}})
			}
			want3 := askAll(t, one.listen, short, false)
			one.stop()
			P := len(tc.bounds) - 1
			base := testutil.Ports(t, 3*P)
			var links []string
			for i := range P {
				links = append(links, fmt.Sprintf("127.0.0.1:%d", base+i))
			}
			var pst []*proc
			var list []string // every prefill stage as ADDR@A:B
			for i := range P {
				pst = append(pst, launchPrefillStage(t, "pp", tc.model, i, tc.bounds, links,
					fmt.Sprintf("127.0.0.1:%d", base+P+2*i), fmt.Sprintf("127.0.0.1:%d", base+P+1+2*i)))
				list = append(list, fmt.Sprintf("%s@%d:%d", pst[i].listen, tc.bounds[i], tc.bounds[i+1]))
			}
			waitHealthy(t, pst...)
			dec := tc.dec
			if dec == nil {
				dec = tc.bounds
			}
			D := len(dec) - 1
			dbase := testutil.Ports(t, 2*D)
			var dlinks []string
			for i := range D {
				dlinks = append(dlinks, fmt.Sprintf("127.0.0.1:%d", dbase+i))
			}
			var dst []*proc
			for i := range D {
				// Each decode stage is told the prefill stage of its
				// layers, or, split differently, every prefill stage.
				prefill := strings.Join(list, ",")
				if tc.dec == nil {
					prefill = pst[i].listen
				}
				dst = append(dst, launchStage(t, "pd", tc.model, i, dec, dlinks, fmt.Sprintf("127.0.0.1:%d", dbase+D+i),
					[]string{"--prefill", prefill, "--remote-prefill-min-tokens", "16"}))
			}
			waitHealthy(t, dst...)
			got := askAll(t, dst[0].listen, reqs, false)
			if got[0].Text != want[0].Text {
				t.Errorf("prefill stages into decode stages: %q, one runner %q", got[0].Text, want[0].Text)
			}
			if n := dst[0].metric(t, outcome("ok")); n != 1 {
				t.Errorf("decode stage 0 counts %v remote prefills ok, want 1\n%s", n, tail(dst[0].logs(), 3000))
			}
			for i, p := range pst { // each served its layers' KV (counted once sent)
				if !testutil.Until(30*time.Second, func() bool { return p.metric(t, `exo_kv_transfer_bytes_total{role="prefill"}`) > 0 }) {
					t.Errorf("prefill stage %d sent no KV bytes:\n%s", i, tail(p.logs(), 3000))
				}
			}
			for i, p := range pst { // cpu: on the prefill stage link, and why
				checkStageTransport(t, p, i, "tcp", "cpu_backend")
			}
			got2 := askAll(t, dst[0].listen, turn2, false)
			if got2[0].Text != want2[0].Text {
				t.Errorf("second turn: %q, one runner %q", got2[0].Text, want2[0].Text)
			}
			// Short prompts sharing the chat template's start: each fill
			// starts past 0 and the prefill stages' caches (which keep no
			// prompt shorter than their block) hold none of it, so the later
			// prefill stage is asked after its computation ended.
			got3 := askAll(t, dst[0].listen, short, false)
			for i := range short {
				if got3[i].Text != want3[i].Text {
					t.Errorf("short prompt %d: %q, one runner %q", i, got3[i].Text, want3[i].Text)
				}
			}
			if n, want := dst[0].metric(t, outcome("ok")), float64(2+len(short)); n != want {
				t.Errorf("decode stage 0 counts %v remote prefills ok, want %v\n%s", n, want, tail(dst[0].logs(), 3000))
			}
			past := 0
			for _, r := range dst[0].records("remote prefill") {
				if r["start_pos"] != "0" {
					past++
				}
			}
			if past < tc.past {
				t.Errorf("%d remote prefills started past position 0, want %d\n%s", past, tc.past, tail(dst[0].logs(), 3000))
			}
		})
	}
}

// TestPrefillPipelineIntoOneRunner: a 2-stage prefill pipeline of real
// processes fills a one-process decode runner told the stages as
// `--prefill ADDR@A:B,…`: the runner asks both stages at once for their
// layers, and its answer equals local prefill's at temperature 0; a
// decode pipeline split differently from the prefill one (decode stage 0
// spans both prefill stages) gives the same answer; with prefill stage 1
// killed the next long prompt falls back to local prefill and still
// answers the same.
func TestPrefillPipelineIntoOneRunner(t *testing.T) {
	model := tinyModel(t, "other") // 3 layers
	reqs := []pipeReq{{user(words(5, 60)), 12, map[string]any{"temperature": 0, "ignore_eos": true}}}
	one := start(t, "one", "decode", "--model", model)
	want := askAll(t, one.listen, reqs, false)
	one.stop()
	bounds := []int{0, 1, 3}
	base := testutil.Ports(t, 6)
	links := []string{fmt.Sprintf("127.0.0.1:%d", base), fmt.Sprintf("127.0.0.1:%d", base+1)}
	var pst []*proc
	for i := range 2 {
		pst = append(pst, launchPrefillStage(t, "pp", model, i, bounds, links,
			fmt.Sprintf("127.0.0.1:%d", base+2+2*i), fmt.Sprintf("127.0.0.1:%d", base+3+2*i)))
	}
	waitHealthy(t, pst...)
	list := fmt.Sprintf("%s@0:1,%s@1:3", pst[0].listen, pst[1].listen)
	d := start(t, "d", "decode", "--model", model, "--prefill", list, "--remote-prefill-min-tokens", "16")
	if got := askAll(t, d.listen, reqs, false); got[0].Text != want[0].Text {
		t.Errorf("2-stage prefill into one runner: %q, local %q", got[0].Text, want[0].Text)
	}
	if n := d.metric(t, outcome("ok")); n != 1 {
		t.Errorf("the decode runner counts %v remote prefills ok, want 1\n%s", n, tail(d.logs(), 3000))
	}
	d.stop()

	// A decode pipeline cut at 2: its stage 0 spans both prefill stages.
	dbase := testutil.Ports(t, 4)
	dlinks := []string{fmt.Sprintf("127.0.0.1:%d", dbase), fmt.Sprintf("127.0.0.1:%d", dbase+1)}
	var dst []*proc
	for i := range 2 {
		dst = append(dst, launchStage(t, "pd", model, i, []int{0, 2, 3}, dlinks, fmt.Sprintf("127.0.0.1:%d", dbase+2+i),
			[]string{"--prefill", list, "--remote-prefill-min-tokens", "16"}))
	}
	waitHealthy(t, dst...)
	reqs2 := []pipeReq{{user(words(5, 60)), 12, map[string]any{"temperature": 0, "ignore_eos": true}}}
	if got := askAll(t, dst[0].listen, reqs2, false); got[0].Text != want[0].Text {
		t.Errorf("2-stage prefill into a decode pipeline split at 2: %q, local %q", got[0].Text, want[0].Text)
	}
	if n := dst[0].metric(t, outcome("ok")); n != 1 {
		t.Errorf("decode stage 0 counts %v remote prefills ok, want 1\n%s", n, tail(dst[0].logs(), 3000))
	}
	for _, p := range dst {
		p.stop()
	}

	// Prefill stage 1 gone: the fill fails and the runner prefills locally.
	pst[1].kill()
	d2 := start(t, "d2", "decode", "--model", model, "--prefill", list, "--remote-prefill-min-tokens", "16")
	reqs3 := []pipeReq{{user(words(5, 60)), 12, map[string]any{"temperature": 0, "ignore_eos": true}}}
	if got := askAll(t, d2.listen, reqs3, false); got[0].Text != want[0].Text {
		t.Errorf("with a prefill stage dead: %q, local %q", got[0].Text, want[0].Text)
	}
	if n := d2.metric(t, outcome("ok")); n != 0 {
		t.Errorf("with a prefill stage dead the runner counts %v remote prefills ok", n)
	}
}

// TestPrefillGroupsIntoOneRunner: two prefill pipeline groups of real
// processes (prefill.groups, each its own ring) fill a one-process decode
// runner told both as the supervisor plans them (`--prefill
// G0S0@0:1,G0S1@1:3,G1S0@0:1,G1S1@1:3`: each range's stages, one per
// group, are replicas tried in order); the answer equals local prefill's
// at temperature 0. With group 0's stage 1 killed, the next long prompt
// is answered the same with no error to the client: its 1:3 range goes to
// group 1's stage 1 (which has its own stage 0 compute the prompt), or the
// fill fails and the runner prefills locally. With all of group 0 dead,
// group 1 fills every range remotely.
func TestPrefillGroupsIntoOneRunner(t *testing.T) {
	model := tinyModel(t, "other") // 3 layers
	ask := func(seed int) []pipeReq {
		return []pipeReq{{user(words(seed, 60)), 12, map[string]any{"temperature": 0, "ignore_eos": true}}}
	}
	one := start(t, "one", "decode", "--model", model)
	want := [][]chatResult{askAll(t, one.listen, ask(5), false), askAll(t, one.listen, ask(6), false), askAll(t, one.listen, ask(7), false)}
	one.stop()
	bounds := []int{0, 1, 3}
	var groups [][]*proc
	var list []string
	for g := range 2 {
		base := testutil.Ports(t, 6)
		links := []string{fmt.Sprintf("127.0.0.1:%d", base), fmt.Sprintf("127.0.0.1:%d", base+1)}
		var pst []*proc
		for i := range 2 {
			pst = append(pst, launchPrefillStage(t, fmt.Sprintf("g%d", g), model, i, bounds, links,
				fmt.Sprintf("127.0.0.1:%d", base+2+2*i), fmt.Sprintf("127.0.0.1:%d", base+3+2*i)))
		}
		groups = append(groups, pst)
		list = append(list, pst[0].listen+"@0:1", pst[1].listen+"@1:3")
	}
	waitHealthy(t, append(slices.Clone(groups[0]), groups[1]...)...)
	d := start(t, "d", "decode", "--model", model, "--prefill", strings.Join(list, ","), "--remote-prefill-min-tokens", "16")
	if got := askAll(t, d.listen, ask(5), false); got[0].Text != want[0][0].Text {
		t.Errorf("two prefill groups into one runner: %q, local %q", got[0].Text, want[0][0].Text)
	}
	if n := d.metric(t, outcome("ok")); n != 1 {
		t.Errorf("the decode runner counts %v remote prefills ok, want 1\n%s", n, tail(d.logs(), 3000))
	}

	// Group 0's stage 1 gone: the answer is the same (askAll fails the
	// test on any error status or error event).
	groups[0][1].kill()
	if got := askAll(t, d.listen, ask(6), false); got[0].Text != want[1][0].Text {
		t.Errorf("with group 0's stage 1 dead: %q, local %q\n%s", got[0].Text, want[1][0].Text, tail(d.logs(), 3000))
	}
	ok := d.metric(t, outcome("ok"))
	t.Logf("with group 0's stage 1 dead: remote prefills ok %v (2: group 1 served 1:3; 1: prefilled locally)", ok)

	// All of group 0 gone: group 1 fills every range (the dead stages
	// refuse connections, so each range goes on to group 1's stage).
	groups[0][0].kill()
	if got := askAll(t, d.listen, ask(7), false); got[0].Text != want[2][0].Text {
		t.Errorf("with group 0 dead: %q, local %q\n%s", got[0].Text, want[2][0].Text, tail(d.logs(), 3000))
	}
	if n := d.metric(t, outcome("ok")); n != ok+1 {
		t.Errorf("with group 0 dead the runner counts %v remote prefills ok, want %v (group 1's)\n%s", n, ok+1, tail(d.logs(), 3000))
	}
}

// TestPrefillPipelineIntoTensorDecode: a 2-stage prefill pipeline of real
// processes fills a 2-rank tensor decode group (each rank told the stages
// as `--prefill ADDR@A:B,…`): every rank asks every prefill stage for that
// stage's layers of its own KV heads, at once, and the group answers as a
// one-process runner with local prefill does (two turns and a seeded
// request, each filled remotely); each prefill stage served each rank's
// heads of every fill.
func TestPrefillPipelineIntoTensorDecode(t *testing.T) {
	model := tinyModel(t, "other") // 3 layers
	bounds := []int{0, 1, 3}
	base := testutil.Ports(t, 6)
	links := []string{fmt.Sprintf("127.0.0.1:%d", base), fmt.Sprintf("127.0.0.1:%d", base+1)}
	var pst []*proc
	for i := range 2 {
		pst = append(pst, launchPrefillStage(t, "ptd", model, i, bounds, links,
			fmt.Sprintf("127.0.0.1:%d", base+2+2*i), fmt.Sprintf("127.0.0.1:%d", base+3+2*i)))
	}
	waitHealthy(t, pst...)
	ref := start(t, "ptd-ref", "decode", "--model", model)
	list := fmt.Sprintf("%s@0:1,%s@1:3", pst[0].listen, pst[1].listen)
	g := startTensor(t, model, 2, "--prefill", list, "--remote-prefill-route", "floor")
	checkRemoteEqualsLocal(t, "2-stage prefill into a 2-rank tensor decode group", g.ranks[0], ref, 700)
	for i, p := range pst {
		served := map[string]int{}
		for _, msg := range []string{"prefill served", "prefill served (followed a request computing the same prompt)"} {
			for _, r := range p.records(msg) {
				served[r["kv_heads"]]++
			}
		}
		if served["0:1"] != 3 || served["1:2"] != 3 || len(served) != 2 {
			t.Errorf("prefill stage %d served kv heads %v, want 0:1 and 1:2 three times each", i, served)
		}
	}
}
