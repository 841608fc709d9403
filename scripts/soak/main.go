// Command soak runs a two-supervisor cluster on loopback (hosts spark on
// 127.0.0.2 with a prefill and a decode runner, mac on 127.0.0.3 with a
// decode runner, one random-weight tiny model) under a steady mix of
// requests — streamed and whole chats, streamed completions, requests the
// client cancels before and during their answer — through both gateways,
// while the cluster file is changed every -reload (a real diff: the decode
// runners restart) and a random runner is SIGKILLed every -kill. At the end
// it reports the outcomes, the 5xx, TTFT p50/p99 of the streams, and the RSS
// and goroutines of every process (first, largest, last sample, and the
// first after -warmup), and exits 1 if any request got a 5xx other than a
// 503 with Retry-After (which a reload that restarts every decode runner of
// the model at once gives while they load), failed before its answer
// started (lost), or if a process grew past the bound after the warm-up:
// its last sample above 1.5× its warm-up sample plus 32 MiB of RSS or plus
// 25 goroutines; a prefill runner may grow by twice its prefix cache more
// (32 MiB here: a successor of a killed one fills it again). A runner's
// goroutines are its exo_goroutines (counted before the scrape gathers;
// its go_goroutines also counts the scrape's own collector goroutines and
// moves by a few from one scrape to the next), a supervisor's its
// go_goroutines. It exits 2 when it could not run (build, cluster start).
//
//	go run ./scripts/soak -duration 30m
//	go run ./scripts/soak -duration 3m -reload 1m -kill 90s -warmup 1m   # CI (scripts/run-tests)
//
// It needs 127.0.0.2 and 127.0.0.3 to be usable (Linux loopback is).
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/exo-pd/exo-pd/internal/sse"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
)

func main() {
	o := options{}
	flag.DurationVar(&o.duration, "duration", 30*time.Minute, "how long to run the load")
	flag.IntVar(&o.workers, "workers", 4, "concurrent clients")
	flag.DurationVar(&o.reload, "reload", 3*time.Minute, "change the cluster file this often (the decode runners restart)")
	flag.DurationVar(&o.kill, "kill", 5*time.Minute, "SIGKILL a random runner this often")
	flag.DurationVar(&o.sample, "sample", 30*time.Second, "sample RSS and goroutines this often")
	flag.DurationVar(&o.warmup, "warmup", 5*time.Minute, "growth of RSS and goroutines is bounded from the first sample after this")
	flag.StringVar(&o.exe, "exo", "", "the exo binary (default: built from this checkout)")
	flag.StringVar(&o.model, "model", "", "the model source (default: a generated tiny llama)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ok, err := run(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(2)
	}
	if !ok {
		os.Exit(1)
	}
}

type options struct {
	duration, reload, kill, sample, warmup time.Duration
	workers                                int
	exe, model                             string
}

type host struct {
	name, api string
	cmd       *exec.Cmd
	log       string
}

// freePort returns the first of 30 consecutive ports free a moment ago,
// below Linux's default ephemeral range (32768–60999), where the local ports
// of outgoing connections are taken: one of those could take a runner's
// port between this check and the runner binding it.
func freePort() (int, error) {
	for range 200 {
		base := 20000 + rand.IntN(12000)
		free := true
		for p := base; p < base+30 && free; p++ {
			l, err := net.Listen("tcp", fmt.Sprintf(":%d", p))
			if err != nil {
				free = false
				continue
			}
			l.Close()
		}
		if free {
			return base, nil
		}
	}
	return 0, errors.New("no 30 consecutive free ports in [20000, 32030)")
}

// prefixCacheMiB is the prefill runner's prefix cache in the soak: small,
// so that its filling (by design; with the default 1 GiB it fills for tens
// of minutes under this mix) does not hide a leak. A prefill runner SIGKILLed
// after the warm-up fills its successor's cache again, so a prefill runner's
// growth bound allows twice the cache on top (live cache plus GC headroom).
const prefixCacheMiB = 32

func cluster(base int, model string, minTokens int) string {
	return fmt.Sprintf(`[cluster]
name = "soak"
runner_port_base = %d
insecure = true # loopback only

[hosts.spark]
address = "127.0.0.2"
backend = "cpu"

[hosts.mac]
address = "127.0.0.3"
backend = "cpu"

[[models]]
name = "tiny"
source = %q
decode = { hosts = ["spark", "mac"] }
prefill = { hosts = ["spark"], prefix_cache_mib = %d }
remote_prefill_min_tokens = %d
`, base, model, prefixCacheMiB, minTokens)
}

// writeAtomic replaces path as editors do (write aside, rename over).
func writeAtomic(path, s string) error {
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(s), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func run(ctx context.Context, o options) (bool, error) {
	dir, err := os.MkdirTemp("", "exo-soak-")
	if err != nil {
		return false, err
	}
	fmt.Printf("soak: working in %s (supervisor logs there)\n", dir)
	if o.exe == "" {
		o.exe = filepath.Join(dir, "exo")
		if out, err := exec.Command("go", "build", "-o", o.exe, "./cmd/exo").CombinedOutput(); err != nil {
			return false, fmt.Errorf("building exo: %v\n%s", err, out)
		}
	}
	if o.model == "" {
		o.model = filepath.Join(dir, "tiny")
		if err := testmodel.Write(o.model, testmodel.Spec{Arch: "llama", Seed: 7, Layers: 2, MaxPositions: 4096}); err != nil {
			return false, err
		}
	}
	base, err := freePort()
	if err != nil {
		return false, err
	}
	apiPort, err := freePort()
	if err != nil {
		return false, err
	}
	cfg := filepath.Join(dir, "cluster.toml")
	minTokens := 1
	if err := writeAtomic(cfg, cluster(base, o.model, minTokens)); err != nil {
		return false, err
	}
	var hosts []*host
	defer func() {
		for _, h := range hosts {
			_ = h.cmd.Process.Signal(syscall.SIGTERM)
		}
		for _, h := range hosts {
			done := make(chan struct{})
			go func() { _ = h.cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				_ = h.cmd.Process.Kill()
				<-done
			}
		}
	}()
	for _, hn := range []struct{ name, ip string }{{"spark", "127.0.0.2"}, {"mac", "127.0.0.3"}} {
		h := &host{name: hn.name, api: fmt.Sprintf("%s:%d", hn.ip, apiPort), log: filepath.Join(dir, hn.name+".log")}
		logf, err := os.Create(h.log)
		if err != nil {
			return false, err
		}
		defer logf.Close()
		h.cmd = exec.Command(o.exe, "supervise", "--config", cfg, "--host", hn.name, "--listen", h.api)
		h.cmd.Stdout, h.cmd.Stderr = logf, logf
		h.cmd.Env = append(os.Environ(), "NOTIFY_SOCKET=")
		if err := h.cmd.Start(); err != nil {
			return false, err
		}
		hosts = append(hosts, h)
	}
	if err := waitHealthy(ctx, hosts, 3*time.Minute); err != nil {
		return false, err
	}
	fmt.Printf("soak: cluster up; %d clients for %v, reload every %v, a runner killed every %v\n", o.workers, o.duration, o.reload, o.kill)

	lctx, cancel := context.WithTimeout(ctx, o.duration)
	defer cancel()
	st := &stats{outcomes: map[string]int{}, proc: map[string]*procStats{}, warmAt: time.Now().Add(o.warmup)}
	var wg sync.WaitGroup
	for w := range o.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			for i := 0; lctx.Err() == nil; i++ {
				h := hosts[rng.IntN(len(hosts))]
				st.add(one(lctx, rng, h.api, fmt.Sprintf("w%d-%d", w, i)))
			}
		}()
	}
	reload, kill, sample := time.NewTicker(o.reload), time.NewTicker(o.kill), time.NewTicker(o.sample)
	defer reload.Stop()
	defer kill.Stop()
	defer sample.Stop()
	st.sample(hosts)
	rng := rand.New(rand.NewPCG(1, uint64(time.Now().UnixNano())))
loop:
	for {
		select {
		case <-lctx.Done():
			break loop
		case <-reload.C:
			minTokens = map[int]int{1: 32, 32: 1}[minTokens]
			if err := writeAtomic(cfg, cluster(base, o.model, minTokens)); err != nil {
				return false, err
			}
			st.event(fmt.Sprintf("reload: remote_prefill_min_tokens = %d", minTokens))
		case <-kill.C:
			h := hosts[rng.IntN(len(hosts))]
			if name, pid, err := killRandomRunner(h, rng); err != nil {
				st.event(fmt.Sprintf("kill on %s: %v", h.name, err))
			} else {
				st.event(fmt.Sprintf("kill: SIGKILL %s on %s (pid %d)", name, h.name, pid))
			}
		case <-sample.C:
			st.sample(hosts)
		}
	}
	wg.Wait()
	st.sample(hosts)
	return st.report(), nil
}

// waitHealthy waits until every gateway sees the model's two decode runners.
func waitHealthy(ctx context.Context, hosts []*host, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		ok := 0
		for _, h := range hosts {
			var v struct {
				Models map[string]struct{ Healthy int } `json:"models"`
			}
			if getJSON("http://"+h.api+"/health", &v) == nil && v.Models["tiny"].Healthy == 2 {
				ok++
			}
		}
		if ok == len(hosts) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the cluster was not healthy within %v (logs in %s)", limit, filepath.Dir(hosts[0].log))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func getJSON(url string, v any) error {
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(resp.Body).Decode(v)
}

func killRandomRunner(h *host, rng *rand.Rand) (string, int, error) {
	var st struct {
		Runners []struct {
			Spec struct {
				Name string `json:"name"`
			} `json:"spec"`
			Status struct {
				PID int `json:"pid"`
			} `json:"status"`
		} `json:"runners"`
	}
	if err := getJSON("http://"+h.api+"/exo/status", &st); err != nil {
		return "", 0, err
	}
	var live []int
	for i, r := range st.Runners {
		if r.Status.PID > 0 {
			live = append(live, i)
		}
	}
	if len(live) == 0 {
		return "", 0, errors.New("no runner running")
	}
	r := st.Runners[live[rng.IntN(len(live))]]
	return r.Spec.Name, r.Status.PID, syscall.Kill(r.Status.PID, syscall.SIGKILL)
}

// result is one request's outcome.
type result struct {
	outcome string        // "200", "503", "cancelled before the answer", …
	code    int           // HTTP status (0: none)
	ttft    time.Duration // streams: time to the first content (0: none)
}

// one sends one request of the mix and classifies what came back.
func one(ctx context.Context, rng *rand.Rand, api, tag string) result {
	kind := rng.IntN(100)
	long := rng.IntN(2) == 0
	prompt := tag + ": " + text(rng, 8)
	if long {
		prompt = tag + ": " + text(rng, 150+rng.IntN(300))
	}
	maxTokens := 8 + rng.IntN(56)
	body := map[string]any{"model": "tiny", "max_tokens": maxTokens, "temperature": 0.7}
	path := "/v1/chat/completions"
	stream, cancelAfterFirst, cancelEarly := true, false, false
	switch {
	case kind < 40: // streamed chat
	case kind < 60: // whole chat
		stream = false
	case kind < 75: // streamed completion
		path = "/v1/completions"
	case kind < 90: // the client goes away after the first token
		cancelAfterFirst = true
	default: // the client goes away before the answer
		cancelEarly = true
	}
	if path == "/v1/completions" {
		body["prompt"] = prompt
	} else {
		body["messages"] = []map[string]string{{"role": "user", "content": prompt}}
	}
	body["stream"] = stream
	b, _ := json.Marshal(body)
	rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if cancelEarly {
		time.AfterFunc(time.Duration(rng.IntN(50))*time.Millisecond, cancel)
	}
	req, _ := http.NewRequestWithContext(rctx, "POST", "http://"+api+path, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	t0 := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		switch {
		case cancelEarly && rctx.Err() != nil:
			return result{outcome: "cancelled before the answer"}
		case ctx.Err() != nil:
			return result{outcome: "ended with the soak"}
		}
		return result{outcome: "failed before the answer: " + shortErr(err)}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
		var eb struct {
			Error struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		_ = json.Unmarshal(raw, &eb)
		out := fmt.Sprintf("%d %s", resp.StatusCode, eb.Error.Code)
		if resp.Header.Get("Retry-After") != "" {
			out += " (Retry-After)"
		}
		return result{outcome: out, code: resp.StatusCode}
	}
	if !stream {
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			if rctx.Err() != nil {
				return result{outcome: "cancelled during the answer", code: 200}
			}
			return result{outcome: "200, body broken: " + shortErr(err), code: 200}
		}
		return result{outcome: "200", code: 200}
	}
	rd := sse.NewReader(bufio.NewReader(resp.Body))
	var ttft time.Duration
	for {
		ev, err := rd.Next()
		if err != nil {
			switch {
			case rctx.Err() != nil && (cancelAfterFirst || cancelEarly):
				return result{outcome: "cancelled during the answer", code: 200, ttft: ttft}
			case ctx.Err() != nil:
				return result{outcome: "ended with the soak", code: 200, ttft: ttft}
			}
			return result{outcome: "200, stream ended without [DONE]", code: 200, ttft: ttft}
		}
		if ev.Data == "[DONE]" {
			return result{outcome: "200", code: 200, ttft: ttft}
		}
		var ch struct {
			Error   json.RawMessage `json:"error"`
			Choices []struct {
				Text  string `json:"text"`
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if json.Unmarshal([]byte(ev.Data), &ch) != nil {
			return result{outcome: "200, bad event", code: 200, ttft: ttft}
		}
		if len(ch.Error) > 0 {
			var e struct {
				Code string `json:"code"`
			}
			_ = json.Unmarshal(ch.Error, &e)
			return result{outcome: "200, stream ended by an error event (" + e.Code + ")", code: 200, ttft: ttft}
		}
		if ttft == 0 && len(ch.Choices) > 0 && ch.Choices[0].Text+ch.Choices[0].Delta.Content != "" {
			ttft = time.Since(t0)
			if cancelAfterFirst {
				cancel()
			}
		}
	}
}

func shortErr(err error) string {
	s := err.Error()
	if i := strings.LastIndex(s, ": "); i >= 0 {
		return s[i+2:]
	}
	return s
}

var vocab = strings.Fields("the of and to in is was for on that with as by at from his her it an were are which this be or have had not but what all when there can out who one been more if no so will about up into time only some could them other than then now its two may over new first any like our very after most where made also way well down should because each just those people how too little state good")

func text(rng *rand.Rand, n int) string {
	w := make([]string, n)
	for i := range w {
		w[i] = vocab[rng.IntN(len(vocab))]
	}
	return strings.Join(w, " ")
}

// procStats is one process's samples.
type procStats struct {
	rss, goroutines [3]float64 // first, largest, last
	warmRSS, warmG  float64    // the first sample after the warm-up
	warm            bool
	n               int
}

// Growth past the warm-up allowed to a process (see the command's doc).
const (
	growthFactor     = 1.5
	growthRSSBytes   = 32 << 20
	growthGoroutines = 25
)

// grew says how p grew past the bound after the warm-up ("" if not);
// cache is the memory p may still fill by design.
func (p *procStats) grew(cache float64) string {
	if !p.warm {
		return ""
	}
	var why []string
	if lim := growthFactor*p.warmRSS + growthRSSBytes + cache; p.rss[2] > lim {
		why = append(why, fmt.Sprintf("RSS %.1f MiB > %.1f MiB", p.rss[2]/(1<<20), lim/(1<<20)))
	}
	if lim := growthFactor*p.warmG + growthGoroutines; p.goroutines[2] > lim {
		why = append(why, fmt.Sprintf("goroutines %.0f > %.0f", p.goroutines[2], lim))
	}
	return strings.Join(why, ", ")
}

type stats struct {
	mu       sync.Mutex
	outcomes map[string]int
	fiveXX   int // every 5xx
	hard     int // 5xx other than a 503 with Retry-After
	ttft     []time.Duration
	proc     map[string]*procStats
	events   []string
	t0       time.Time
	warmAt   time.Time // samples from then on are past the warm-up
}

func (s *stats) add(r result) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.outcomes[r.outcome]++
	if r.code >= 500 {
		s.fiveXX++
		if r.code != http.StatusServiceUnavailable || !strings.HasSuffix(r.outcome, "(Retry-After)") {
			s.hard++
		}
	}
	if r.ttft > 0 {
		s.ttft = append(s.ttft, r.ttft)
	}
}

func (s *stats) event(e string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.t0.IsZero() {
		s.t0 = time.Now()
	}
	line := fmt.Sprintf("%s %s", time.Now().Format("15:04:05"), e)
	s.events = append(s.events, line)
	fmt.Println("soak:", line)
}

// sample reads process_resident_memory_bytes and the goroutines of each
// supervisor (go_goroutines) and (merged into its /metrics with a runner
// label) of each of its runners (exo_goroutines: a runner's go_goroutines
// moves with the scrape's own goroutines, which would blur the flatness
// check).
func (s *stats) sample(hosts []*host) {
	warm := !time.Now().Before(s.warmAt)
	for _, h := range hosts {
		c := &http.Client{Timeout: 5 * time.Second}
		resp, err := c.Get("http://" + h.api + "/metrics")
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			var metric string
			switch {
			case strings.HasPrefix(line, "process_resident_memory_bytes"), strings.HasPrefix(line, "exo_supervisor_process_resident_memory_bytes"):
				metric = "rss"
			case strings.HasPrefix(line, "go_goroutines"):
				metric = "go_goroutines"
			case strings.HasPrefix(line, "exo_goroutines"):
				metric = "exo_goroutines"
			default:
				continue
			}
			name := h.name + "/supervisor"
			runner := false
			if i := strings.Index(line, `runner="`); i >= 0 {
				rest := line[i+len(`runner="`):]
				name = h.name + "/" + rest[:strings.IndexByte(rest, '"')]
				runner = true
			}
			switch {
			case metric == "go_goroutines" && !runner, metric == "exo_goroutines" && runner:
				metric = "goroutines"
			case metric != "rss":
				continue // a runner's go_goroutines (blurred by its scrape), or an unlabelled exo_goroutines
			}
			f := strings.Fields(line)
			v, err := strconv.ParseFloat(f[len(f)-1], 64)
			if err != nil {
				continue
			}
			s.mu.Lock()
			p := s.proc[name]
			if p == nil {
				p = &procStats{}
				s.proc[name] = p
			}
			arr, warmV := &p.rss, &p.warmRSS
			if metric == "goroutines" {
				arr, warmV = &p.goroutines, &p.warmG
				p.n++
			}
			if warm && !p.warm {
				*warmV = v
			}
			if arr[0] == 0 {
				arr[0] = v
			}
			arr[1] = max(arr[1], v)
			arr[2] = v
			s.mu.Unlock()
		}
		resp.Body.Close()
	}
	if warm {
		s.mu.Lock()
		for _, p := range s.proc {
			p.warm = p.warm || p.warmRSS > 0
		}
		s.mu.Unlock()
	}
}

func pct(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

// report prints the summary and says whether the soak passed: no 5xx but
// 503s with Retry-After (every runner of the model restarting at once, as
// a reload that changes them all does), no request failed before its
// answer started, and no process grew past the bound after the warm-up.
func (s *stats) report() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	total := 0
	var keys []string
	for k, n := range s.outcomes {
		keys = append(keys, k)
		total += n
	}
	sort.Strings(keys)
	fmt.Printf("\nsoak: %d requests\n", total)
	failed := 0
	for _, k := range keys {
		fmt.Printf("  %-60s %d\n", k, s.outcomes[k])
		if strings.HasPrefix(k, "failed before") {
			failed += s.outcomes[k]
		}
	}
	fmt.Printf("5xx: %d, of which other than 503 with Retry-After: %d; failed before the answer: %d\n", s.fiveXX, s.hard, failed)
	fmt.Printf("TTFT (streams, %d): p50 %v, p99 %v\n", len(s.ttft), pct(s.ttft, 0.5).Round(time.Millisecond), pct(s.ttft, 0.99).Round(time.Millisecond))
	var names []string
	for n := range s.proc {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Printf("%-28s %37s %32s\n", "process", "RSS MiB first/warm/max/last", "goroutines first/warm/max/last")
	var grown []string
	for _, n := range names {
		p := s.proc[n]
		fmt.Printf("%-28s %10.1f %8.1f %8.1f %8.1f %8.0f %7.0f %7.0f %7.0f\n", n,
			p.rss[0]/(1<<20), p.warmRSS/(1<<20), p.rss[1]/(1<<20), p.rss[2]/(1<<20), p.goroutines[0], p.warmG, p.goroutines[1], p.goroutines[2])
		cache := 0.0
		if strings.HasSuffix(n, "-prefill") {
			cache = 2 * prefixCacheMiB << 20
		}
		if why := p.grew(cache); why != "" {
			grown = append(grown, n+": "+why)
		}
	}
	if len(grown) > 0 {
		fmt.Printf("grew past the bound after the warm-up (%.1f× + %d MiB RSS, a prefill runner + %d MiB more for its prefix cache; + %d goroutines):\n",
			growthFactor, growthRSSBytes>>20, 2*prefixCacheMiB, growthGoroutines)
		for _, g := range grown {
			fmt.Println("  " + g)
		}
	}
	fmt.Println("(a runner's first sample is from its first process, a killed or restarted runner's later ones from its successor;")
	fmt.Println(" a supervisor exports no goroutine count: 0)")
	fmt.Println("events:")
	for _, e := range s.events {
		fmt.Println("  " + e)
	}
	if s.warmAt.After(time.Now()) {
		fmt.Println("(the run ended before the warm-up did: growth not checked)")
	}
	return s.hard == 0 && failed == 0 && len(grown) == 0
}
