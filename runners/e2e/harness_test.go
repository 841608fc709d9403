package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/internal/sse"
	"github.com/exo-pd/exo-pd/internal/testutil"
	"github.com/exo-pd/exo-pd/runners/openai"
)

var exoBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "exo-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	exoBin = filepath.Join(dir, "exo")
	root, err := repoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	cmd := exec.Command("go", "build", "-o", exoBin, "./cmd/exo")
	cmd.Dir = root
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building exo:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func repoRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	return filepath.Dir(strings.TrimSpace(string(out))), nil
}

// freeAddr returns a loopback address with a port that was free a moment
// ago, outside the kernel's ephemeral range (testutil.Addr: no outgoing
// connection on a busy machine takes it before the runner binds it).
func freeAddr(t *testing.T) string {
	t.Helper()
	return testutil.Addr(t)
}

// proc is a running exo process.
type proc struct {
	t      *testing.T
	name   string
	cmd    *exec.Cmd
	http   string   // address serving /health and /metrics
	listen string   // --listen
	env    []string // added to the environment the process starts with
	mu     sync.Mutex
	log    bytes.Buffer
	done   chan struct{}
}

func (p *proc) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.Write(b)
}

func (p *proc) logs() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.String()
}

// launch starts exo with args in its own process group, logging into p;
// at cleanup it stops it and, when t failed, logs the last logTail bytes
// of its output under label.
func (p *proc) launch(t *testing.T, args []string, label string, logTail int) {
	t.Helper()
	p.cmd = exec.Command(exoBin, args...)
	if p.env != nil {
		p.cmd.Env = append(os.Environ(), p.env...)
	}
	p.cmd.Stdout, p.cmd.Stderr = p, p
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			t.Logf("--- %s log:\n%s", label, tail(p.logs(), logTail))
		}
	})
}

// start runs `exo runner ROLE args…` and waits for /health to say ok.
func start(t *testing.T, name, role string, args ...string) *proc {
	t.Helper()
	// The ports are picked free, then bound by the child: another test
	// process may take one in between. Such a start is retried on new ports.
	for attempt := 1; ; attempt++ {
		p, taken := startOnce(t, name, role, attempt < 4, args...)
		if !taken {
			return p
		}
		t.Logf("%s: a port was taken before the runner bound it; starting again on new ports", name)
	}
}

// prefillBackendArgs is what every prefill runner a test starts gets
// before the test's own arguments (a later flag wins): nothing, or by
// hand, with libmlxc, EXO_E2E_PREFILL_BACKEND=mlx runs every prefill
// runner on MLX (CPU device) against cpu decode runners, the Spark→Mac
// pairing of two different engines. A test that starts a prefill runner
// without start (a tensor prefill group's followers) adds these too, so
// that a group's ranks share one backend.
func prefillBackendArgs() []string {
	be := os.Getenv("EXO_E2E_PREFILL_BACKEND")
	if be == "" {
		return nil
	}
	if be != "mlx" {
		return []string{"--backend", be}
	}
	// MLX's CPU backend runs 4-bit matmuls as scalar code on x86 (DESIGN
	// §11: about 3 GFLOP/s): a default 256-token chunk of SmolLM2 took
	// 22–25 s here on an idle machine, and longer under load, against the
	// decode side's 30 s bound on the wait for the next KV frame (kvwire's
	// ProgressTimeout), which then gave up and prefilled locally. 32-token
	// chunks put a frame on the wire every few seconds, as a prefill host
	// should; a test that sets --prefill-chunk itself overrides this.
	return []string{"--backend", be, "--device", "cpu", "--prefill-chunk", "32"}
}

// startOnce is one try of start; taken reports that the runner exited
// because one of its ports was taken (only when retry is set).
func startOnce(t *testing.T, name, role string, retry bool, args ...string) (_ *proc, taken bool) {
	t.Helper()
	p := &proc{t: t, name: name, done: make(chan struct{})}
	p.listen = freeAddr(t)
	p.http = p.listen
	full := []string{"runner", role, "--listen", p.listen, "--served-name", "m", "--backend", "cpu", "--offline"}
	if role == "prefill" {
		p.http = freeAddr(t)
		full = append(full, "--metrics", p.http)
		full = append(full, prefillBackendArgs()...)
	}
	if role == "decode" && slices.Contains(args, "--prefill") && !slices.Contains(args, "--remote-prefill-route") {
		// Most tests here test the KV transfer itself (fidelity, failover,
		// corruption, auth), not the routing: they fix the route by the
		// floor so that each long prompt goes remote whatever the cost
		// model would predict on this machine. The route tests pass
		// --remote-prefill-route explicitly (the runner's default is cost).
		full = append(full, "--remote-prefill-route", "floor")
	}
	full = append(full, args...)
	p.launch(t, full, p.name, 4000)
	exited := false
	if !testutil.Until(120*time.Second, func() bool {
		select {
		case <-p.done:
			exited = true
			return true
		default:
		}
		resp, err := http.Get("http://" + p.http + "/health")
		if err != nil {
			return false
		}
		var h struct{ Status string }
		_ = json.NewDecoder(resp.Body).Decode(&h)
		resp.Body.Close()
		return resp.StatusCode == 200 && h.Status == "ok"
	}) {
		t.Fatalf("%s not healthy after 120 s:\n%s", name, p.logs())
	}
	if exited {
		if retry && strings.Contains(p.logs(), "is taken") {
			return nil, true
		}
		t.Fatalf("%s exited during start-up:\n%s", name, p.logs())
	}
	return p, false
}

func (p *proc) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

func (p *proc) kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// metric returns the value of one series from /metrics (0 when absent).
func (p *proc) metric(t *testing.T, series string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + p.http + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			if err != nil {
				t.Fatalf("metric %s: %v", line, err)
			}
			return v
		}
	}
	return 0
}

// metricPrefix returns the sum of every series of a metric (any labels)
// from /metrics.
func (p *proc) metricPrefix(t *testing.T, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + p.http + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var sum float64
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, name)
		if !ok || rest == "" || (rest[0] != ' ' && rest[0] != '{') {
			continue
		}
		f := strings.Fields(rest[strings.LastIndexByte(rest, '}')+1:])
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			t.Fatalf("metric %s: %v", line, err)
		}
		sum += v
	}
	return sum
}

func outcome(o string) string { return `exo_remote_prefill_total{outcome="` + o + `"}` }

// chatResult is what a streamed chat request produced.
type chatResult struct {
	Status     int
	Text       string
	Finish     string
	Prompt     int
	Completion int
	Cached     int
	Done       bool
	ErrorBody  string
	Events     int
}

type msg struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// chatStream sends a streaming chat request at temperature 0; only on
// the test goroutine (it fails the test when the request cannot be made).
func chatStream(t *testing.T, addr string, msgs []msg, maxTokens int, extra map[string]any) chatResult {
	t.Helper()
	res, err := chatStreamCtx(context.Background(), addr, msgs, maxTokens, extra, nil)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// goChat is chatStream for a goroutine other than the test's: a request
// that cannot be made or read comes back as Status 0 with the error in
// ErrorBody, which the test goroutine's check of Status reports.
func goChat(addr string, msgs []msg, maxTokens int, extra map[string]any) chatResult {
	res, err := chatStreamCtx(context.Background(), addr, msgs, maxTokens, extra, nil)
	if err != nil {
		res.Status, res.ErrorBody = 0, err.Error()
	}
	return res
}

// longStream is a long streamed generation running beside the test, for
// a fault to be injected while it streams.
type longStream struct{ done chan chatResult }

// startLongStream sends prompt to addr for up to maxTokens tokens
// (ignore_eos) and returns once its first text has streamed; a request
// that ends before that fails the test. An error reading the stream is
// appended to the result's ErrorBody.
func startLongStream(t *testing.T, addr, prompt string, maxTokens int) *longStream {
	t.Helper()
	s := &longStream{done: make(chan chatResult, 1)}
	first := make(chan struct{})
	var once sync.Once
	go func() {
		r, err := chatStreamCtx(t.Context(), addr, user(prompt), maxTokens, ignoreEOS, func(string) { once.Do(func() { close(first) }) })
		if err != nil {
			r.ErrorBody = strings.TrimSpace(r.ErrorBody + " " + err.Error())
		}
		s.done <- r
	}()
	select {
	case <-first:
	case r := <-s.done:
		t.Fatalf("the long request ended before it streamed: %+v", r)
	}
	return s
}

// wait returns the long request's result; a request still streaming limit
// after the fault (what) fails the test.
func (s *longStream) wait(t *testing.T, limit time.Duration, what string) chatResult {
	t.Helper()
	select {
	case r := <-s.done:
		return r
	case <-time.After(limit):
		t.Fatalf("the long request did not end within %v of %s", limit, what)
		return chatResult{}
	}
}

// chatStreamCtx is chatStream for any goroutine: a request that cannot be
// made or read is an error, for the caller to hand to the test goroutine.
// onText, when set, is called with each piece of content as it arrives.
// A stream ended by cancelling ctx returns what had come, and no error.
func chatStreamCtx(ctx context.Context, addr string, msgs []msg, maxTokens int, extra map[string]any, onText func(string)) (chatResult, error) {
	body := map[string]any{"model": "m", "messages": msgs, "stream": true, "temperature": 0, "max_tokens": maxTokens}
	for k, v := range extra {
		body[k] = v
	}
	b, _ := json.Marshal(body)
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+addr+"/v1/chat/completions", bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return chatResult{}, fmt.Errorf("chat request: %w", err)
	}
	defer resp.Body.Close()
	res := chatResult{Status: resp.StatusCode}
	if resp.StatusCode != 200 {
		eb, _ := io.ReadAll(resp.Body)
		res.ErrorBody = string(eb)
		return res, nil
	}
	rd := sse.NewReader(resp.Body)
	var text strings.Builder
	for {
		ev, err := rd.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			res.Text = text.String()
			if ctx.Err() != nil {
				return res, nil // cancelled: what had come
			}
			return res, fmt.Errorf("reading stream: %w", err)
		}
		data := ev.Data
		res.Events++
		if data == "[DONE]" {
			res.Done = true
			continue
		}
		var ch struct {
			openai.ChatChunk
			Error *json.RawMessage `json:"error"`
		}
		if err := json.Unmarshal([]byte(data), &ch); err != nil {
			return res, fmt.Errorf("bad SSE event %q: %w", data, err)
		}
		if ch.Error != nil {
			res.ErrorBody = string(*ch.Error)
		}
		for _, c := range ch.Choices {
			if c.Delta != nil && c.Delta.Content != nil {
				text.WriteString(*c.Delta.Content)
				if onText != nil && *c.Delta.Content != "" {
					onText(*c.Delta.Content)
				}
			}
			if c.FinishReason != nil {
				res.Finish = *c.FinishReason
			}
		}
		if ch.Usage != nil {
			res.Prompt, res.Completion = ch.Usage.PromptTokens, ch.Usage.CompletionTokens
			if ch.Usage.PromptTokensDetails != nil {
				res.Cached = ch.Usage.PromptTokensDetails.CachedTokens
			}
		}
	}
	res.Text = text.String()
	return res, nil
}

// words makes a deterministic pseudo-text of about n words.
func words(seed, n int) string {
	vocab := strings.Fields("the of and to in is was for on that with as by at from his her it an were are which this be or have had not but what all when there can out who one been more if no so will about up into time only some could them other than then now its two may over new first any like our very after most where made also way well down should because each just those people how too little state good very make world still own see men work long get here between both life being under never day same another know while last might us great old year off come since against go came right used take three")
	var b strings.Builder
	x := uint32(seed*2654435761 + 1)
	for i := range n {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(vocab[x%uint32(len(vocab))])
	}
	return b.String()
}

// records returns p's log records whose msg is msg ("" for all), each
// read by key (testutil.Records), in the order logged.
func (p *proc) records(msg string) []testutil.Record { return testutil.Records(p.logs(), msg) }

// waitRecords waits up to timeout for p to have logged n records with
// msg and returns them all; it fails the test when they do not come.
func (p *proc) waitRecords(t *testing.T, msg string, n int, timeout time.Duration) []testutil.Record {
	t.Helper()
	var recs []testutil.Record
	if !testutil.Until(timeout, func() bool { recs = p.records(msg); return len(recs) >= n }) {
		t.Fatalf("%s logged %d %q records in %v, want %d:\n%s", p.name, len(recs), msg, timeout, n, tail(p.logs(), 3000))
	}
	return recs
}

// lastOutcome returns the remote-prefill outcome logged for the last
// request (the outcome attribute of the runner's last record with one).
func (p *proc) lastOutcome() string {
	recs := p.records("")
	for i := len(recs) - 1; i >= 0; i-- {
		if o, ok := recs[i]["outcome"]; ok {
			return o
		}
	}
	return ""
}

// outcomeSoon is lastOutcome once it reads want, or after 5 s whatever it
// reads: the runner logs a request's outcome after the response's last
// event, so a client can see the end of the stream before the log line.
func (p *proc) outcomeSoon(want string) string {
	var got string
	testutil.Until(5*time.Second, func() bool { got = p.lastOutcome(); return got == want })
	return got
}

func jsonNewDecoder(resp *http.Response) *json.Decoder { return json.NewDecoder(resp.Body) }
