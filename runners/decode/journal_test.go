package decode

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
	"github.com/exo-pd/exo-pd/runners/metrics"
)

func getJournal(t *testing.T, url string, since int) Journal {
	t.Helper()
	resp, err := http.Get(url + JournalPath + "?since=" + itoa(int32(since)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("%s: %s", JournalPath, resp.Status)
	}
	var j Journal
	if err := json.NewDecoder(resp.Body).Decode(&j); err != nil {
		t.Fatal(err)
	}
	return j
}

// TestJournal: the decode runner's JournalPath lists each request with its
// route (a real prefill runner over loopback TCP for one, local for one
// that disables remote prefill), the KV bytes that crossed, timings and
// token counts, and the link to the prefill endpoint; ?since= returns only
// newer records.
func TestJournal(t *testing.T) { testJournal(t, false) }

// TestJournalCostModel: with the cost model deciding (measured rates that
// make the remote faster), the remote record carries its reason and the
// predicted fill, and the link its measured goodput.
func TestJournalCostModel(t *testing.T) { testJournal(t, true) }

func testJournal(t *testing.T, cost bool) {
	var endpoint string
	s := startTinyServer(t, testmodel.Spec{Arch: "llama", Seed: 7, Layers: 2}, func(_ Text, o *Options) {
		m := o.Model.(*engine.Model)
		endpoint = servePrefill(t, m, 16, nil)
		r := loopbackRemote(m, endpoint)
		r.Breaker = NewBreaker([]string{endpoint}, BreakerOptions{})
		o.Remote = r
		o.RemoteMinTokens = 1
		if cost {
			rt := &Router{Rates: NewRates(), KVBytesPerToken: 1024, Endpoints: func() []string { return []string{endpoint} }}
			rt.Rates.ObservePrefill("local", 100, 10*time.Second) // 10 tokens/s here
			rt.Rates.ObservePrefill(endpoint, 1000, time.Millisecond)
			rt.Rates.ObserveTransfer(endpoint, 1<<30, time.Second)
			o.Router = rt
		}
	})
	if j := getJournal(t, s.url, 0); len(j.Requests) != 0 || j.Model != "m" {
		t.Fatalf("fresh runner's journal: %+v", j)
	}
	s.chat(t, nil)
	s.chat(t, map[string]any{"x_exo_disable_remote_prefill": true,
		"messages": []map[string]any{{"role": "user", "content": "something else entirely"}}})
	j := getJournal(t, s.url, 0)
	if len(j.Requests) != 2 {
		t.Fatalf("want 2 records, got %+v", j.Requests)
	}
	remote, local := j.Requests[0], j.Requests[1]
	if remote.Route != RouteRemote || remote.Outcome != metrics.OutcomeOK || remote.Endpoint != endpoint ||
		remote.KVBytes <= 0 || remote.KVTransfer <= 0 {
		t.Errorf("remote record: %+v", remote)
	}
	if local.Route != RouteLocal || local.Outcome != metrics.OutcomeSkippedDisabled || local.KVBytes != 0 {
		t.Errorf("local record: %+v", local)
	}
	if cost && (remote.Reason != ReasonFaster || remote.PredictedFill <= 0 || len(j.Links) != 1 || j.Links[0].Goodput <= 0) {
		t.Errorf("with the cost model: remote record %+v, links %+v", remote, j.Links)
	}
	if !cost && (remote.Reason != "" || remote.PredictedFill != 0 || len(j.Links) != 1 || j.Links[0].Goodput != 0) {
		t.Errorf("without a cost model: remote record %+v, links %+v", remote, j.Links)
	}
	for _, r := range j.Requests {
		if !r.Done || r.PromptTokens <= 1 || r.CompletionTokens != 8 || r.TTFT <= 0 || r.Fill <= 0 ||
			r.TTFT < r.Fill || r.Duration < r.TTFT || r.TokensPerSecond <= 0 || r.FinishReason != "length" || r.Error != "" {
			t.Errorf("record %s: %+v", r.ID, r)
		}
	}
	if remote.Seq >= local.Seq {
		t.Errorf("seq not increasing: %d, %d", remote.Seq, local.Seq)
	}
	if len(j.Links) != 1 || j.Links[0].Endpoint != endpoint || !j.Links[0].Up || j.Links[0].Kind != "loopback" ||
		j.Links[0].LastGoodput <= 0 {
		t.Errorf("links: %+v", j.Links)
	}
	if j2 := getJournal(t, s.url, int(remote.Seq)); len(j2.Requests) != 1 || j2.Requests[0].ID != local.ID {
		t.Errorf("since %d: %+v", remote.Seq, j2.Requests)
	}
}

// TestJournalRing: the journal keeps the latest journalSize records,
// oldest first.
func TestJournalRing(t *testing.T) {
	var j journal
	for i := range journalSize + 10 {
		j.begin(itoa(int32(i)), "m", time.Time{})
	}
	got := j.since(0)
	if len(got) != journalSize || got[0].Seq != 11 || got[len(got)-1].Seq != journalSize+10 {
		t.Fatalf("%d records, first %d, last %d", len(got), got[0].Seq, got[len(got)-1].Seq)
	}
	for i := 1; i < len(got); i++ {
		if got[i].Seq != got[i-1].Seq+1 {
			t.Fatalf("order broken at %d: %d after %d", i, got[i].Seq, got[i-1].Seq)
		}
	}
	if n := len(j.since(uint64(journalSize + 5))); n != 5 {
		t.Errorf("since: %d records, want 5", n)
	}
}

// memModel is the tiny model with a backend that accounts its memory as
// MLX's does.
type memModel struct{ *engine.Model }

type memBackend struct{ engine.Backend }

func (memBackend) ActiveMemory() (int64, int64, error) { return 3 << 20, 1 << 20, nil }
func (memBackend) PeakMemory(bool) (int64, error)      { return 5 << 20, nil }

func (m memModel) Backend() engine.Backend { return memBackend{m.Model.Backend()} }

// TestJournalEngineMemory: a backend that accounts its memory has it in
// the journal, sampled in the background (the first answer may come
// before the first sample); one that does not, has none.
func TestJournalEngineMemory(t *testing.T) {
	s := startTinyServer(t, testmodel.Spec{Arch: "llama", Seed: 7, Layers: 2}, func(_ Text, o *Options) {
		o.Model = memModel{o.Model.(*engine.Model)}
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		j := getJournal(t, s.url, 0)
		if m := j.Memory; m != nil {
			if m.Active != 3<<20 || m.Cache != 1<<20 || m.Peak != 5<<20 || m.Sampled.IsZero() {
				t.Fatalf("engine memory %+v", m)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("engine memory never sampled")
		}
		time.Sleep(10 * time.Millisecond)
	}
	plain := startTinyServer(t, testmodel.Spec{Arch: "llama", Seed: 7, Layers: 2}, func(Text, *Options) {})
	if j := getJournal(t, plain.url, 0); j.Memory != nil {
		t.Errorf("cpu backend reports engine memory %+v", j.Memory)
	}
}
