// Package gateway owns the OpenAI-compatible API every supervisor serves on
// port 52415: it lists the cluster's models, and forwards each completion
// request — streaming (SSE) included, flushed chunk by chunk, cancelled when
// the client goes away — to a healthy decode runner of the requested model:
// this host's first, then the least loaded elsewhere, as their /health
// reports (waiting + running). A model without a healthy decode runner gets
// 503 with the reasons, an unknown model 404, both as OpenAI-style JSON
// errors. It speaks to runners only over HTTP and must not import runners/.
package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/exo-pd/exo-pd/internal/apierr"
	"github.com/exo-pd/exo-pd/supervisor/config"
)

// MaxBody is the largest request body the gateway forwards.
const MaxBody = 32 << 20

// MaxHeaderBytes bounds a request's line and headers at the gateway's
// http.Server; past it (plus net/http's 4 KiB of read slack) Go answers
// 431 Request Header Fields Too Large before any handler runs. 64 KiB is
// far above what real clients send (nginx allows 32 KiB by default) and
// far under Go's default of 1 MiB, with which a 1 MB header got through.
// The runners bound theirs the same (openai.MaxHeaderBytes), so whatever
// the gateway forwards a runner accepts.
const MaxHeaderBytes = 64 << 10

// Options tune a Gateway.
type Options struct {
	Logger      *slog.Logger
	HealthEvery time.Duration // poll interval of runners' /health; default 1s
	// HealthTimeout bounds one /health check (default 2 s). A runner
	// that does not answer is out of rotation until it does; a request
	// forwarded to it that has no answer yet is sent to the next runner.
	HealthTimeout time.Duration
	Transport     http.RoundTripper
	// Instance, when set, gives the instance token this host's supervisor
	// passed to a local runner (by runner name; "" = unknown): a local
	// backend whose /health reports another instance is not healthy (its
	// port is answered by a process this supervisor did not start).
	Instance func(runner string) string
	// RunnerError, when set, gives the error a local runner last exited
	// with (by runner name; "" = none), added to a 503's reasons so the
	// client sees why (e.g. a model that cannot be found, with its hint).
	RunnerError func(runner string) string
}

// Backend is one decode runner the gateway may forward to.
type Backend struct {
	Model, Runner, Host, Addr string
	Local                     bool
	// Group: the runner is a pipeline group's stage 0 or a tensor group's
	// rank 0, whose answers need the group's other runners too.
	Group bool
}

// Health is what the gateway knows about a backend.
type Health struct {
	OK       bool      `json:"ok"`
	Status   string    `json:"status"` // "ok", "loading", or the error
	Progress float64   `json:"progress,omitempty"`
	Waiting  int       `json:"waiting"`
	Running  int       `json:"running"`
	Checked  time.Time `json:"checked"`
	// Silent: the check got no HTTP answer at all (refused, timeout).
	Silent bool `json:"silent,omitempty"`
}

type snapshot struct {
	cors     []string // [api] cors_origins
	host     string
	models   []string
	backends map[string][]Backend // model → decode runners
	// unplaced says, by model, why it has no decode runner to route to
	// yet (a pipeline waiting for its placement).
	unplaced map[string]string
}

// Gateway forwards API requests to decode runners.
type Gateway struct {
	o      Options
	log    *slog.Logger
	client *http.Client // for forwarding: no timeout (streams)
	probe  *http.Client // for /health
	snap   atomic.Pointer[snapshot]
	kick   chan struct{}

	mu     sync.Mutex
	health map[string]Health // by addr
}

// New returns a gateway serving nothing until SetConfig.
func New(o Options) *Gateway {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.HealthEvery == 0 {
		o.HealthEvery = time.Second
	}
	if o.HealthTimeout == 0 {
		o.HealthTimeout = 2 * time.Second
	}
	tr := o.Transport
	if tr == nil {
		tr = http.DefaultTransport
	}
	g := &Gateway{o: o, log: o.Logger, client: &http.Client{Transport: tr},
		probe: &http.Client{Transport: tr, Timeout: o.HealthTimeout},
		kick:  make(chan struct{}, 1), health: map[string]Health{}}
	g.snap.Store(&snapshot{backends: map[string][]Backend{}})
	return g
}

// SetConfig switches the gateway to a (new) cluster file; localHost is the
// host this supervisor runs on.
func (g *Gateway) SetConfig(c *config.Config, localHost string) {
	s := &snapshot{host: localHost, backends: map[string][]Backend{}, cors: c.API.CORSOrigins, unplaced: map[string]string{}}
	for _, p := range c.Placements() {
		if p.Role == config.Decode && p.Stages == nil {
			s.unplaced[p.Model] = fmt.Sprintf("its decode %s is not placed yet: %s", p.Shard, p.Note)
		}
	}
	for _, m := range c.Models {
		s.models = append(s.models, m.Name)
		for _, r := range c.DecodeRunners(m.Name) {
			if !r.ServesAPI() {
				continue // a pipeline's later stages serve no API
			}
			s.backends[m.Name] = append(s.backends[m.Name], Backend{
				Model: m.Name, Runner: r.Name, Host: r.Host, Addr: r.HealthAddr(), Local: r.Host == localHost,
				Group: r.Stage != "" || r.Tensor != ""})
		}
	}
	g.snap.Store(s)
	select {
	case g.kick <- struct{}{}:
	default:
	}
}

// Run polls every backend's /health until ctx ends.
func (g *Gateway) Run(ctx context.Context) {
	t := time.NewTicker(g.o.HealthEvery)
	defer t.Stop()
	for {
		g.pollAll(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-g.kick:
		}
	}
}

func (g *Gateway) pollAll(ctx context.Context) {
	var all []Backend
	for _, bs := range g.snap.Load().backends {
		all = append(all, bs...)
	}
	g.poll(ctx, all)
}

func (g *Gateway) poll(ctx context.Context, bs []Backend) {
	var wg sync.WaitGroup
	for _, b := range bs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h := g.check(ctx, b)
			g.mu.Lock()
			g.health[b.Addr] = h
			g.mu.Unlock()
		}()
	}
	wg.Wait()
}

func (g *Gateway) check(ctx context.Context, b Backend) Health {
	addr := b.Addr
	h := Health{Checked: time.Now()}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/health", nil)
	if err != nil {
		h.Status = err.Error()
		return h
	}
	resp, err := g.probe.Do(req)
	if err != nil {
		h.Status, h.Silent = shortErr(err), true
		return h
	}
	defer resp.Body.Close()
	var body struct {
		Status   string  `json:"status"`
		Progress float64 `json:"progress"`
		Waiting  int     `json:"waiting"`
		Running  int     `json:"running"`
		Instance string  `json:"instance"`
		PID      int     `json:"pid"`
		Error    string  `json:"error"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<16)).Decode(&body); err != nil {
		h.Status = fmt.Sprintf("bad /health (%s): %v", resp.Status, err)
		return h
	}
	if b.Local && g.o.Instance != nil {
		// No token: this supervisor has not started the runner (yet, or
		// between restarts), so whatever answers on its port is not it —
		// a second supervisor of the same cluster file probing before its
		// own runner starts must not take the first one's for its own.
		want := g.o.Instance(b.Runner)
		if want == "" {
			h.Status = fmt.Sprintf("runner %s is not running under this supervisor (yet); %s answers for another process", b.Runner, addr)
			return h
		}
		if body.Instance != want {
			h.Status = fmt.Sprintf("%s is answered by another process (pid %d), not runner %s started by this supervisor: its port is taken (another exo supervise running? change runner_port_base or the model's port in the cluster file)", addr, body.PID, b.Runner)
			return h
		}
	}
	h.OK = resp.StatusCode == http.StatusOK
	h.Status, h.Progress, h.Waiting, h.Running = body.Status, body.Progress, body.Waiting, body.Running
	if h.Status == "" {
		h.Status = resp.Status
	}
	return h
}

func shortErr(err error) string {
	s := err.Error()
	if i := strings.LastIndex(s, ": "); i >= 0 && strings.Contains(s, "dial") {
		return s[i+2:]
	}
	return s
}

// Health returns the known health of every backend, by address.
func (g *Gateway) Health() map[string]Health {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make(map[string]Health, len(g.health))
	for k, v := range g.health {
		out[k] = v
	}
	return out
}

// candidates orders model's healthy backends: local first, then by load.
func (g *Gateway) candidates(model string) (ok []Backend, reasons []string) {
	bs := g.snap.Load().backends[model]
	g.mu.Lock()
	defer g.mu.Unlock()
	type cand struct {
		b    Backend
		load int
	}
	var cs []cand
	for _, b := range bs {
		h, known := g.health[b.Addr]
		switch {
		case !known:
			reasons = append(reasons, fmt.Sprintf("%s on %s (%s): not checked yet", b.Runner, b.Host, b.Addr))
		case !h.OK:
			r := fmt.Sprintf("%s on %s (%s): %s", b.Runner, b.Host, b.Addr, h.Status)
			if h.Status == "loading" {
				r += fmt.Sprintf(" %.0f%%", 100*h.Progress)
			}
			if b.Local && g.o.RunnerError != nil {
				if e := g.o.RunnerError(b.Runner); e != "" {
					r += "; it last exited with: " + e
				}
			}
			reasons = append(reasons, r)
		default:
			cs = append(cs, cand{b, h.Waiting + h.Running})
		}
	}
	sort.SliceStable(cs, func(i, j int) bool {
		if cs[i].b.Local != cs[j].b.Local {
			return cs[i].b.Local
		}
		return cs[i].load < cs[j].load
	})
	for _, c := range cs {
		ok = append(ok, c.b)
	}
	return ok, reasons
}

func (g *Gateway) markDown(addr, why string) {
	g.mu.Lock()
	g.health[addr] = Health{Status: why, Checked: time.Now()}
	g.mu.Unlock()
}

// ForwardedPaths are the POST routes the gateway forwards to decode
// runners, routed by the body's "model": the generation APIs and the
// vLLM-shaped tokenizer endpoints (exo bench builds token-exact prompts
// with them). Any other path is the gateway's own JSON 404.
var ForwardedPaths = []string{
	"/v1/chat/completions", "/v1/completions", "/v1/responses",
	"/v1/messages", "/v1/messages/count_tokens",
	"/tokenize", "/detokenize",
}

// Handler serves /v1/models, /v1/models/{id}, /health and forwards
// ForwardedPaths to decode runners. A path it does not serve is a 404 and
// a known path with the wrong method a 405 with Allow, both JSON in the
// shape of the API the path belongs to (not net/http's plain text).
func (g *Gateway) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/models", g.models)
	mux.HandleFunc("GET /v1/models/{id...}", g.model)
	mux.HandleFunc("GET /health", g.healthz)
	for _, p := range ForwardedPaths {
		mux.HandleFunc("POST "+p, g.forward)
	}
	// The Responses API's retrieval routes: nothing is stored, say so.
	mux.HandleFunc("GET /v1/responses/{id}", g.notStored)
	mux.HandleFunc("DELETE /v1/responses/{id}", g.notStored)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, pattern := mux.Handler(r); pattern != "" {
			mux.ServeHTTP(w, r)
			return
		}
		// No route for this method: the methods that have one on this
		// path make it a 405 with Allow, none a 404; said in JSON. Every
		// method net/http names is asked, so a route added later with
		// another method is listed without a change here.
		var allow []string
		for _, m := range []string{http.MethodDelete, http.MethodGet, http.MethodHead, http.MethodOptions,
			http.MethodPatch, http.MethodPost, http.MethodPut} {
			other := *r // a shallow copy: only the method differs
			other.Method = m
			if _, p := mux.Handler(&other); p != "" {
				allow = append(allow, m)
			}
		}
		if len(allow) == 0 {
			APIError(w, r, http.StatusNotFound, "invalid_request_error", "not_found",
				fmt.Sprintf("no route %s %s on this server", r.Method, r.URL.Path))
			return
		}
		w.Header().Set("Allow", strings.Join(allow, ", "))
		APIError(w, r, http.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed",
			fmt.Sprintf("method %s is not allowed on %s (allowed: %s)", r.Method, r.URL.Path, strings.Join(allow, ", ")))
	})
}

func (g *Gateway) notStored(w http.ResponseWriter, r *http.Request) {
	APIError(w, r, http.StatusNotFound, "invalid_request_error", "not_found",
		fmt.Sprintf("response %q not found: this server stores no responses (send the whole conversation as input)", r.PathValue("id")))
}

// CORS answers browsers for the origins in [api] cors_origins: it adds
// Access-Control-Allow-Origin to responses and answers preflight OPTIONS
// requests itself (204; 403 for an origin not allowed). Requests without
// an Origin header pass through untouched. It wraps the whole API,
// authentication included: preflights carry no key, and a 401 must be
// readable by the page that caused it.
func (g *Gateway) CORS(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		origin := r.Header.Get("Origin")
		allowed := g.snap.Load().cors
		if origin == "" || len(allowed) == 0 {
			next.ServeHTTP(w, r)
			return
		}
		allow := ""
		for _, o := range allowed {
			if o == "*" {
				allow = "*"
				break
			}
			if strings.EqualFold(o, origin) {
				allow = origin
			}
		}
		h := w.Header()
		h.Add("Vary", "Origin")
		preflight := r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != ""
		if allow == "" {
			if preflight {
				APIError(w, r, http.StatusForbidden, "invalid_request_error", "origin_not_allowed",
					fmt.Sprintf("origin %q is not allowed by [api] cors_origins", origin))
				return
			}
			next.ServeHTTP(w, r)
			return
		}
		h.Set("Access-Control-Allow-Origin", allow)
		if preflight {
			h.Set("Access-Control-Allow-Methods", "GET, POST, OPTIONS")
			if req := r.Header.Get("Access-Control-Request-Headers"); req != "" {
				h.Set("Access-Control-Allow-Headers", req)
			}
			h.Set("Access-Control-Max-Age", "600")
			w.WriteHeader(http.StatusNoContent)
			return
		}
		h.Set("Access-Control-Expose-Headers", "X-Exo-Runner")
		next.ServeHTTP(w, r)
	})
}

type modelObj struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

func (g *Gateway) models(w http.ResponseWriter, r *http.Request) {
	s := g.snap.Load()
	data := []modelObj{}
	for _, m := range s.models {
		data = append(data, modelObj{m, "model", 0, "exo"})
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data})
}

func (g *Gateway) model(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	for _, m := range g.snap.Load().models {
		if m == id {
			writeJSON(w, http.StatusOK, modelObj{m, "model", 0, "exo"})
			return
		}
	}
	g.unknownModel(w, r, id)
}

func (g *Gateway) healthz(w http.ResponseWriter, r *http.Request) {
	s := g.snap.Load()
	type mh struct {
		Healthy int `json:"healthy"`
		Total   int `json:"total"`
	}
	models := map[string]mh{}
	status := "ok"
	for _, m := range s.models {
		ok, _ := g.candidates(m)
		models[m] = mh{len(ok), len(s.backends[m])}
		if len(ok) == 0 {
			status = "degraded"
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": status, "host": s.host, "models": models})
}

// APIError writes the gateway's own error in the shape of the API the
// request speaks: Anthropic's {"type":"error","error":{"type","message"}}
// on /v1/messages (its type from the status as Anthropic documents it,
// internal/apierr, the map runners/anthropic uses too), OpenAI's {"error":{"message","type",
// "code","param"}} everywhere else.
func APIError(w http.ResponseWriter, r *http.Request, code int, typ, errCode, msg string) {
	if IsAnthropic(r.URL.Path) {
		writeJSON(w, code, map[string]any{"type": "error", "error": map[string]any{"type": apierr.AnthropicType(code), "message": msg}})
		return
	}
	writeJSON(w, code, map[string]any{"error": map[string]any{"message": msg, "type": typ, "code": errCode, "param": nil}})
}

// IsAnthropic reports whether path is one of Anthropic's Messages API routes.
func IsAnthropic(path string) bool {
	return path == "/v1/messages" || strings.HasPrefix(path, "/v1/messages/")
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func (g *Gateway) unknownModel(w http.ResponseWriter, r *http.Request, name string) {
	APIError(w, r, http.StatusNotFound, "invalid_request_error", "model_not_found",
		fmt.Sprintf("model %q is not served by this cluster (models: %s)", name, strings.Join(g.snap.Load().models, ", ")))
}

var hopByHop = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Authenticate": true, "Proxy-Authorization": true,
	"Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true, "Proxy-Connection": true,
}

func (g *Gateway) forward(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxBody+1))
	if err != nil {
		APIError(w, r, http.StatusBadRequest, "invalid_request_error", "bad_body", "reading request body: "+err.Error())
		return
	}
	if len(body) > MaxBody {
		APIError(w, r, http.StatusRequestEntityTooLarge, "invalid_request_error", "body_too_large", fmt.Sprintf("request body over %d bytes", MaxBody))
		return
	}
	var req *struct { // nil: the body was null
		Model string `json:"model"`
	}
	if err := json.Unmarshal(body, &req); err != nil || req == nil {
		code, msg := bodyError(err)
		APIError(w, r, http.StatusBadRequest, "invalid_request_error", code, msg)
		return
	}
	if req.Model == "" {
		APIError(w, r, http.StatusBadRequest, "invalid_request_error", "missing_model", `request has no "model"`)
		return
	}
	if snap := g.snap.Load(); len(snap.backends[req.Model]) == 0 {
		if why, ok := snap.unplaced[req.Model]; ok {
			w.Header().Set("Retry-After", "5")
			APIError(w, r, http.StatusServiceUnavailable, "server_error", "not_placed", fmt.Sprintf("model %q: %s", req.Model, why))
			return
		}
		g.unknownModel(w, r, req.Model)
		return
	}
	cands, reasons := g.candidates(req.Model)
	if len(cands) == 0 { // stale view? look again now
		g.poll(r.Context(), g.snap.Load().backends[req.Model])
		cands, reasons = g.candidates(req.Model)
	}
	// A request whose answer has not started (no byte of it sent to the
	// client) goes to the next runner when this one fails to connect,
	// breaks before its first body byte, goes silent, or answers 503 (it
	// is stopping or loading), or, for a group's first runner, any 5xx (a
	// stage or rank is lost): a restart is never the client's error.
	for _, b := range cands {
		up, err := g.sendWatched(r, b, body)
		if err != nil {
			if r.Context().Err() != nil {
				return // the client went away
			}
			why := shortErr(err)
			g.log.Warn("decode runner unreachable; trying the next", "model", req.Model, "runner", b.Runner, "host", b.Host, "err", why)
			g.markDown(b.Addr, why)
			reasons = append(reasons, fmt.Sprintf("%s on %s (%s): %s", b.Runner, b.Host, b.Addr, why))
			continue
		}
		if up.resp.StatusCode == http.StatusServiceUnavailable {
			why := "answered 503: " + refusal(up)
			up.close()
			g.log.Info("decode runner refused the request; trying the next", "model", req.Model, "runner", b.Runner, "host", b.Host, "why", why)
			g.markDown(b.Addr, why)
			reasons = append(reasons, fmt.Sprintf("%s on %s (%s): %s", b.Runner, b.Host, b.Addr, why))
			continue
		}
		if b.Group && up.resp.StatusCode >= 500 {
			// A group's first runner that fails a request before its
			// answer began has lost a stage or rank (its link is down);
			// the group is out until its /health says otherwise, and
			// another group or replica serves the request.
			why := fmt.Sprintf("answered %d: %s", up.resp.StatusCode, refusal(up))
			up.close()
			g.log.Warn("a pipeline or tensor group failed the request before answering; trying the next", "model", req.Model, "runner", b.Runner, "host", b.Host, "why", why)
			g.markDown(b.Addr, why)
			reasons = append(reasons, fmt.Sprintf("%s on %s (%s): %s", b.Runner, b.Host, b.Addr, why))
			continue
		}
		g.relay(w, r, up, b)
		up.close()
		return
	}
	w.Header().Set("Retry-After", "1")
	APIError(w, r, http.StatusServiceUnavailable, "server_error", "no_healthy_runner",
		fmt.Sprintf("no healthy decode runner for model %q: %s", req.Model, strings.Join(reasons, "; ")))
}

// bodyError is the error code and message for a body that is not a JSON
// object with a string "model" (err: json.Unmarshal's into a pointer to
// such a struct; nil when the body was null), without Go's type names.
func bodyError(err error) (code, msg string) {
	var te *json.UnmarshalTypeError
	switch {
	case err == nil:
		return "invalid_json", "request body must be a JSON object, got null"
	case errors.As(err, &te) && te.Field == "model":
		return "invalid_model", `"model" must be a string, got ` + te.Value
	case errors.As(err, &te) && te.Field == "":
		kind := map[string]string{"array": "an array", "string": "a string", "number": "a number", "bool": "a boolean"}[te.Value]
		if kind == "" {
			kind = te.Value
		}
		return "invalid_json", "request body must be a JSON object, got " + kind
	}
	return "invalid_json", "request body is not JSON: " + strings.TrimPrefix(err.Error(), "json: ")
}

// upstream is a runner's answer as far as the gateway has read it before
// committing to it: the headers and the first bytes of the body.
type upstream struct {
	resp     *http.Response
	first    []byte
	firstErr error // io.EOF when first is the whole body
	cancel   context.CancelCauseFunc
}

func (u *upstream) close() {
	u.resp.Body.Close()
	u.cancel(nil)
}

// refusal is the message of a runner's error answer (its OpenAI error
// body's message, else its status).
func refusal(u *upstream) string {
	b := u.first
	if u.firstErr == nil {
		rest, _ := io.ReadAll(io.LimitReader(u.resp.Body, 1<<16))
		b = append(b, rest...)
	}
	var eb struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(b, &eb) == nil && eb.Error.Message != "" {
		return eb.Error.Message
	}
	return u.resp.Status
}

// errWentSilent: the runner stopped answering /health before it answered
// the forwarded request.
var errWentSilent = errors.New("stopped answering /health before answering the request")

// sendWatched sends the request to b and waits for its response headers
// and the first bytes of its body, giving up (errWentSilent) if the health
// poller finds b not answering meanwhile: a stopped or hung runner would
// otherwise hold the request until its supervisor restarts it. Until then
// nothing was sent to the client and the body is still in hand, so the
// next runner can serve it; a connection that breaks before the first body
// byte is an error here too. The upstream's close releases the request.
func (g *Gateway) sendWatched(r *http.Request, b Backend, body []byte) (*upstream, error) {
	ctx, cancel := context.WithCancelCause(r.Context())
	since := time.Now()
	type result struct {
		up  *upstream
		err error
	}
	ch := make(chan result, 1)
	go func() {
		resp, err := g.send(r.WithContext(ctx), b, body)
		if err != nil {
			ch <- result{err: err}
			return
		}
		buf := make([]byte, 32<<10)
		n, rerr := resp.Body.Read(buf)
		for n == 0 && rerr == nil { // a Read may return nothing; the first byte is what counts
			n, rerr = resp.Body.Read(buf)
		}
		if n == 0 && !errors.Is(rerr, io.EOF) {
			resp.Body.Close()
			ch <- result{err: fmt.Errorf("answer broke before its first byte: %w", rerr)}
			return
		}
		if rerr != nil && !errors.Is(rerr, io.EOF) {
			rerr = nil // the bytes read count; the break shows on the next Read
		}
		ch <- result{up: &upstream{resp: resp, first: buf[:n], firstErr: rerr, cancel: cancel}}
	}()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case res := <-ch:
			if res.err != nil {
				cancel(nil)
				if errors.Is(context.Cause(ctx), errWentSilent) {
					return nil, errWentSilent
				}
				return nil, res.err
			}
			return res.up, nil
		case <-tick.C:
			if g.silentSince(b.Addr, since) {
				cancel(errWentSilent)
			}
		}
	}
}

// silentSince reports whether a health check that started after t found
// addr not answering (a transport error, not a "loading" answer).
func (g *Gateway) silentSince(addr string, t time.Time) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	h, ok := g.health[addr]
	return ok && !h.OK && h.Silent && h.Checked.After(t)
}

func (g *Gateway) send(r *http.Request, b Backend, body []byte) (*http.Response, error) {
	url := "http://" + b.Addr + r.URL.Path
	if r.URL.RawQuery != "" {
		url += "?" + r.URL.RawQuery
	}
	out, err := http.NewRequestWithContext(r.Context(), r.Method, url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	for k, vs := range r.Header {
		if !hopByHop[k] {
			out.Header[k] = vs
		}
	}
	return g.client.Do(out)
}

// relay copies the runner's answer to the client, flushing every chunk.
// An event stream is passed on whole events at a time, so that when the
// runner's connection breaks mid-stream (it was killed) the client gets a
// well-formed error event the SDKs raise on, not a torn event.
func (g *Gateway) relay(w http.ResponseWriter, r *http.Request, up *upstream, b Backend) {
	resp := up.resp
	for k, vs := range resp.Header {
		if !hopByHop[k] {
			w.Header()[k] = vs
		}
	}
	w.Header().Set("X-Exo-Runner", b.Host+"/"+b.Runner)
	w.WriteHeader(resp.StatusCode)
	rc := http.NewResponseController(w)
	sse := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	var pending []byte // an event stream's bytes after its last complete event
	pass := func(p []byte) bool {
		if sse {
			pending = append(pending, p...)
			i := bytes.LastIndex(pending, []byte("\n\n"))
			if i < 0 {
				return true
			}
			p = pending[:i+2]
			defer func() { pending = append(pending[:0], pending[i+2:]...) }()
		}
		if _, werr := w.Write(p); werr != nil {
			return false // client gone; returning cancels the upstream request
		}
		_ = rc.Flush()
		return true
	}
	if !pass(up.first) {
		return
	}
	err := up.firstErr
	buf := make([]byte, 32<<10)
	for err == nil {
		var n int
		n, err = resp.Body.Read(buf)
		if n > 0 && !pass(buf[:n]) {
			return
		}
	}
	if errors.Is(err, io.EOF) {
		if len(pending) > 0 { // a stream that ended without a blank line
			_, _ = w.Write(pending)
		}
		return
	}
	if r.Context().Err() != nil {
		return // the client went away
	}
	g.log.Warn("stream from decode runner broke", "runner", b.Runner, "host", b.Host, "err", err)
	if sse {
		_, _ = w.Write(streamError(r.URL.Path, fmt.Sprintf("the decode runner %s on %s stopped mid-answer (%v); retry the request", b.Runner, b.Host, err)))
		_ = rc.Flush()
	}
}

// streamError is the event that ends a stream whose runner went away, in
// the form of the API the client speaks, each one its SDK raises on:
// Anthropic's `event: error`; for OpenAI's, a data object with an "error"
// member (what the runners send themselves when a generation fails
// mid-stream; the Responses API's as a typed "error" event).
func streamError(path, msg string) []byte {
	detail := map[string]any{"message": msg, "type": "server_error", "param": nil, "code": "runner_lost"}
	var name string
	var v any
	switch path {
	case "/v1/messages":
		name, v = "error", map[string]any{"type": "error", "error": map[string]any{"type": "api_error", "message": msg}}
	case "/v1/responses":
		name, v = "error", map[string]any{"type": "error", "code": "runner_lost", "message": msg, "param": nil, "error": detail}
	default:
		v = map[string]any{"error": detail}
	}
	b, _ := json.Marshal(v)
	var out []byte
	if name != "" {
		out = append(out, "event: "+name+"\n"...)
	}
	out = append(out, "data: "...)
	out = append(out, b...)
	return append(out, "\n\n"...)
}
