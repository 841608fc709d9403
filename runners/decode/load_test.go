package decode

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/runners/kvwire"
)

func TestFetchPrefillLoad(t *testing.T) {
	cases := []struct {
		name, body string
		code       int
		want       PrefillLoad
		err        string
	}{
		{"ok", `{"status":"ok","role":"prefill","waiting":2,"running":1}`, 200, PrefillLoad{Waiting: 2, Running: 1}, ""},
		{"idle", `{"status":"ok","role":"prefill","waiting":0,"running":0}`, 200, PrefillLoad{}, ""},
		{"loading", `{"status":"loading","role":"prefill"}`, 503, PrefillLoad{}, "HTTP 503"},
		{"a decode runner", `{"status":"ok","role":"decode","waiting":1,"running":1}`, 200, PrefillLoad{}, `role "decode"`},
		{"negative", `{"status":"ok","role":"prefill","waiting":-1,"running":0}`, 200, PrefillLoad{}, "negative"},
		{"not json", `<html>`, 200, PrefillLoad{}, "invalid character"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != "/health" {
					http.NotFound(w, r)
					return
				}
				w.WriteHeader(c.code)
				_, _ = w.Write([]byte(c.body))
			}))
			defer srv.Close()
			got, err := FetchPrefillLoad(context.Background(), srv.Client(), strings.TrimPrefix(srv.URL, "http://"))
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err %v, want %q", err, c.err)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("got %+v %v, want %+v", got, err, c.want)
			}
		})
	}
}

// TestWatchLoadRanksABusyHostLast: two equal prefill hosts; the first
// one's /health reports a queue, WatchLoad feeds it to the selector, and
// the router (SelectorAhead) then predicts it slower and ranks the idle
// one first. Without the report the given order stands.
func TestWatchLoadRanksABusyHostLast(t *testing.T) {
	var mu sync.Mutex
	load := map[string]string{"busy": `{"role":"prefill","waiting":3,"running":1}`, "idle": `{"role":"prefill","waiting":0,"running":0}`}
	health := map[string]string{}
	for name := range load {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			defer mu.Unlock()
			_, _ = w.Write([]byte(load[name]))
		}))
		defer srv.Close()
		health[name+":1"] = strings.TrimPrefix(srv.URL, "http://")
	}
	sel := kvwire.NewSelector([]kvwire.Endpoint{{Addr: "busy:1", Link: kvwire.LinkEthernet}, {Addr: "idle:1", Link: kvwire.LinkEthernet}})
	rt := &Router{Rates: NewRates(), KVBytesPerToken: 1024, Ahead: SelectorAhead(sel),
		Endpoints: func() []string { return []string{"busy:1", "idle:1"} }}
	rt.ObserveLocal(1000, 10*time.Second) // local: 100 tok/s
	for _, a := range []string{"busy:1", "idle:1"} {
		rt.ObserveRemote(a, 1000, 0, 1<<20, time.Second) // 1000 tok/s each
		rt.ObserveProbe(a, 1<<30, time.Second)
	}
	if d := rt.Decide(1000, 64); d.Endpoint != "busy:1" {
		t.Fatalf("before any load report: endpoint %s, want the first given (%+v)", d.Endpoint, d)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type rep struct {
		addr string
		n    int
	}
	reported := make(chan rep, 16)
	go WatchLoad(ctx, health, 10*time.Millisecond, func(addr string, n int, err error) {
		if err != nil {
			t.Errorf("%s: %v", addr, err)
		}
		sel.ReportLoad(addr, n)
		select {
		case reported <- rep{addr, n}:
		default:
		}
	})
	seen := map[string]bool{}
	for len(seen) < 2 {
		seen[(<-reported).addr] = true
	}
	d := rt.Decide(1000, 64)
	if d.Endpoint != "idle:1" || !slices.Equal(d.Order, []string{"idle:1", "busy:1"}) || d.Ahead["busy:1"] != 4 {
		t.Fatalf("with busy:1 reporting 3 waiting + 1 running: %+v, want idle:1 first and 4 ahead at busy:1", d)
	}
	// Drained, it is first again (the given order breaks the tie).
	mu.Lock()
	load["busy"] = `{"role":"prefill","waiting":0,"running":0}`
	mu.Unlock()
	for r := <-reported; r != (rep{"busy:1", 0}); r = <-reported {
	}
	if d := rt.Decide(1000, 64); d.Endpoint != "busy:1" {
		t.Fatalf("after busy:1 drained: endpoint %s, want busy:1 again (%+v)", d.Endpoint, d)
	}
}
