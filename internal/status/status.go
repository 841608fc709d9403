// Package status owns `exo status`: it fetches a running supervisor's
// cluster view (supervisor/dashboard's JSON at dashboard.StatePath, with
// the gateway's API key when the cluster file names one) and renders it
// as the text tables docs/OPERATIONS.md describes. It only reads: it
// changes nothing on any host. It must not import runners/ (the
// supervisor's types are its input) and must not be imported by
// supervisor/ or runners/.
package status

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/exo-pd/exo-pd/supervisor/config"
	"github.com/exo-pd/exo-pd/supervisor/dashboard"
	"github.com/exo-pd/exo-pd/supervisor/gateway"
	"github.com/exo-pd/exo-pd/supervisor/gpu"
	"github.com/exo-pd/exo-pd/supervisor/process"
)

// Options are `exo status`'s flags.
type Options struct {
	// API is the supervisor's API URL; empty means the cluster file's
	// port on its [api] listen address when that names one, else on
	// 127.0.0.1; without a cluster file config.DefaultAPIPort.
	API string
	// Config is the cluster file naming the API port and key file; when
	// it is config.DefaultPath a missing or unreadable file is no error.
	Config string
	// JSON prints the state as the supervisor sent it.
	JSON bool
}

// UsageError is a mistake in the options (an unloadable cluster file that
// was named explicitly, an unusable URL): the caller exits 2 with it.
type UsageError struct{ Msg string }

func (e UsageError) Error() string { return e.Msg }

// Run asks the supervisor o names for its state (within 10s) and writes it
// to out: raw JSON with o.JSON, else the tables of Print.
func Run(ctx context.Context, out io.Writer, o Options) error {
	url := o.API
	var key []byte // the gateway's API key, when the cluster file names one we can read
	c, cerr := config.Load(o.Config)
	if cerr != nil && o.Config != config.DefaultPath {
		return UsageError{"status: " + cerr.Error()}
	}
	if cerr == nil && c.API.APIKeyFile != "" {
		var err error
		if key, err = gateway.ReadKeyFile(c.API.APIKeyFile); err != nil {
			return fmt.Errorf("status: %w", err)
		}
	}
	if url == "" {
		host, port := "127.0.0.1", config.DefaultAPIPort
		if cerr == nil {
			port = c.API.Port
			// A gateway bound to one address answers only there.
			if l := c.API.Listen; l != "" && !net.ParseIP(l).IsUnspecified() {
				host = l
			}
		}
		url = "http://" + net.JoinHostPort(host, strconv.Itoa(port))
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(url, "/")+dashboard.StatePath, nil)
	if err != nil {
		return UsageError{err.Error()}
	}
	if key != nil {
		req.Header.Set("Authorization", "Bearer "+string(key))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("no supervisor answering at %s (is `exo supervise` running?): %w", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("read status: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status from %s: %s", url, resp.Status)
	}
	if o.JSON {
		_, err := out.Write(body)
		return err
	}
	var st dashboard.State
	if err := json.Unmarshal(body, &st); err != nil {
		return fmt.Errorf("decode status: %w", err)
	}
	Print(out, &st, time.Now())
	return nil
}

// Print prints the cluster as the supervisor at the other end sees
// it: that host first (as before the cluster view existed), then every host,
// model, link and the latest requests (docs/OPERATIONS.md).
func Print(out io.Writer, st *dashboard.State, now time.Time) {
	var me *dashboard.HostView
	for _, h := range st.Hosts {
		if h.Name == st.Host {
			me = h.View
		}
	}
	if me == nil {
		me = &dashboard.HostView{Name: st.Host}
	}
	fmt.Fprintf(out, "cluster %s, host %s, up %s\nconfig  %s\napi     %s/v1\n", st.Cluster, st.Host, now.Sub(me.Started).Round(time.Second), me.Config, me.API)
	rl := me.LastReload
	if rl.OK {
		fmt.Fprintf(out, "reload  ok at %s (%s)\n", rl.At.Format(time.RFC3339), rl.Changes)
	} else {
		first, _, _ := strings.Cut(rl.Error, "\n")
		fmt.Fprintf(out, "reload  FAILED at %s, previous config still running: %s\n", rl.At.Format(time.RFC3339), first)
	}
	if rl.Pending != "" {
		fmt.Fprintf(out, "restart needed: the file changes what only a restart of the supervisor applies: %s\n", rl.Pending)
	}
	fmt.Fprintln(out, "\nRUNNERS ON THIS HOST")
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tROLE\tSTATE\tPID\tRESTARTS\tADDRESS\tDETAIL")
	for _, r := range me.Runners {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", r.Spec.Name, r.Spec.Role, r.Status.State, pidText(r.Status.PID), r.Status.Restarts, r.Spec.HealthAddr(), runnerDetail(r.Status, r.LoadETA, now))
	}
	tw.Flush()

	fmt.Fprintln(out, "\nHOSTS")
	runnersOf := map[string][]string{}
	for _, m := range st.Models {
		for _, r := range m.Runners {
			runnersOf[r.Host] = append(runnersOf[r.Host], r.Runner)
		}
	}
	tw = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tADDRESS\tBACKEND\tSUPERVISOR\tMEMORY USED\tGPU\tCLOCK\tRUNNERS")
	for _, h := range st.Hosts {
		sup, mem, gpus, clock := "up", "-", "-", "-"
		switch {
		case !h.Up:
			sup = "DOWN: " + h.Error
		case !h.SameConfig:
			sup = "up, OTHER cluster file"
		}
		if v := h.View; v != nil {
			if m := v.Memory; m != nil {
				mem = fmt.Sprintf("%s / %s", gib(m.Used), gib(m.Total))
			}
			var gs []string
			for _, g := range v.GPUs {
				gs = append(gs, gpuText(g))
			}
			if len(gs) > 0 {
				gpus = strings.Join(gs, "; ")
			}
			clock = "reference"
			if h.Name != st.Host {
				clock = fmt.Sprintf("%+dms ±%dms", time.Duration(h.ClockOffset*1e9).Milliseconds(), max(1, time.Duration(h.ClockUncertainty*1e9).Milliseconds()))
			}
		}
		rs := runnersOf[h.Name]
		sort.Strings(rs)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", h.Name, h.Address, h.Backend, sup, mem, gpus, clock, strings.Join(rs, ", "))
	}
	tw.Flush()

	if len(st.Models) > 0 {
		fmt.Fprintln(out, "\nMODELS")
		tw = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "MODEL\tHOST\tRUNNER\tROLE\tSTATE\tRESTARTS\tQUEUE\tDETAIL")
		for _, m := range st.Models {
			for _, r := range m.Runners {
				queue, detail := "-", "-"
				if r.Health == "ok" {
					queue = fmt.Sprintf("%d+%d", r.Waiting, r.Running)
				}
				switch {
				case r.Health == "loading":
					detail = fmt.Sprintf("loading %.0f%%", 100*r.Progress)
					if r.TotalBytes > 0 {
						detail = fmt.Sprintf("%s %s / %s (%.0f%% in all)", r.Phase, bytesText(r.DoneBytes), bytesText(r.TotalBytes), 100*r.Progress)
					}
					if r.LoadETA > 0 {
						detail += fmt.Sprintf(", about %s left", (time.Duration(r.LoadETA * 1e9)).Round(time.Second))
					}
				case r.State != "ready" && r.LastError != "" && r.LastExit == "":
					detail = r.LastError
				case r.State != "ready" && r.LastError != "":
					detail = r.LastExit + ": " + r.LastError
				case r.LastExit != "":
					detail = "last exit: " + r.LastExit
				}
				role := r.Role
				if r.Stage != "" {
					role = fmt.Sprintf("%s stage %s", r.Role, r.Stage)
					if r.Layers != "" {
						role += " layers " + r.Layers
					}
				}
				if r.Tensor != "" && r.Stage != "" { // a rank of a tensor stage
					role += " rank " + r.Tensor
				} else if r.Tensor != "" {
					role = fmt.Sprintf("%s rank %s", r.Role, r.Tensor)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", m.Name, r.Host, r.Runner, role, r.State, r.Restarts, queue, detail)
			}
		}
		tw.Flush()
		printPlacements(out, st.Models)
	}

	if len(st.Links) > 0 {
		fmt.Fprintln(out, "\nLINKS")
		tw = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "DECODE\tPREFILL\tENDPOINT\tKIND\tGOODPUT\tLAST TRANSFER\tSTATE")
		for _, l := range st.Links {
			state := "up"
			if !l.Up {
				state = "skipped (not answering)"
			}
			kind := l.Kind
			if l.Interface != "" {
				kind += " (" + l.Interface + ")"
			}
			fmt.Fprintf(tw, "%s/%s\t%s\t%s\t%s\t%s\t%s\t%s\n", l.DecodeHost, l.Runner, l.PrefillHost, l.Endpoint, kind, rate(l.Goodput), rate(l.LastGoodput), state)
		}
		tw.Flush()
	}

	if n := len(st.Requests); n > 0 {
		const last = 10
		rs := st.Requests[max(0, n-last):]
		fmt.Fprintf(out, "\nRECENT REQUESTS (%d of %d)\n", len(rs), n)
		tw = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "START\tMODEL\tDECODE\tPROMPT\tCACHED\tROUTE\tTTFT\tFILL (PREDICTED)\tKV\tTOK/S\tOUT")
		for _, r := range rs {
			route := r.Route
			why := r.Outcome
			if r.Route == "remote" {
				why = r.Reason
				if why == "" {
					why = "floor"
				}
				if r.PrefillHost != "" {
					why += ", from " + r.PrefillHost
				}
			}
			if why != "" {
				route += " (" + why + ")"
			}
			fill := secsText(r.Fill)
			if r.PredictedFill > 0 {
				fill += " (" + secsText(r.PredictedFill) + ")"
			}
			kv := "-"
			if r.KVBytes > 0 {
				kv = fmt.Sprintf("%s in %s", bytesText(r.KVBytes), secsText(r.KVTransfer))
			}
			tps := "-"
			if r.TokensPerSecond > 0 {
				tps = fmt.Sprintf("%.1f", r.TokensPerSecond)
			}
			res := fmt.Sprintf("%d tok", r.CompletionTokens)
			switch {
			case r.Error != "":
				res = "error: " + r.Error
			case !r.Done:
				res = "running"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Start.In(now.Location()).Format("15:04:05"), r.Model, r.Host, r.PromptTokens, r.CachedTokens, route, secsText(r.TTFT), fill, kv, tps, res)
		}
		tw.Flush()
	}

	if len(me.Decode) > 0 {
		fmt.Fprintln(out, "\nDECODE RUNNERS AS THE GATEWAY SEES THEM")
		addrs := make([]string, 0, len(me.Decode))
		for a := range me.Decode {
			addrs = append(addrs, a)
		}
		sort.Strings(addrs)
		tw = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		for _, a := range addrs {
			h := me.Decode[a]
			state := "down: " + h.Status
			if h.OK {
				state = fmt.Sprintf("ok (waiting %d, running %d)", h.Waiting, h.Running)
			}
			fmt.Fprintf(tw, "%s\t%s\n", a, state)
		}
		tw.Flush()
	}
}

func pidText(pid int) string {
	if pid > 0 {
		return strconv.Itoa(pid)
	}
	return "-"
}

// runnerDetail is the DETAIL column of a local runner.
func runnerDetail(s process.Status, eta float64, now time.Time) string {
	detail := s.LastExit
	if e := s.LastError; e != "" && s.State != process.Ready {
		detail += ": " + e
	}
	if h := s.Health; h != nil {
		switch {
		case h.Status == "loading":
			detail = fmt.Sprintf("loading/downloading %.0f%%", 100*h.Progress)
			if eta > 0 {
				detail += fmt.Sprintf(", about %s left", time.Duration(eta*1e9).Round(time.Second))
			}
		case h.Status == "ok":
			detail = fmt.Sprintf("waiting %d, running %d", h.Waiting, h.Running)
			if s.Restarts > 0 && s.LastExit != "" {
				detail += "; last restart: " + s.LastExit
			}
		case h.Status != "":
			detail = h.Status
		}
		if t := h.StageTransport; t != nil {
			detail += "; hidden states over " + t.Transport
			if t.Reason != "" {
				detail += " (" + t.Reason + ")"
			}
		}
		for _, e := range h.PrefillEndpoints {
			// The breaker's words read backwards to an operator: a closed
			// circuit is a prefill endpoint in use.
			state := e.State
			switch state {
			case "closed":
				state = "up"
			case "open":
				state = "skipped, circuit open"
			}
			detail += fmt.Sprintf("; prefill %s %s", e.Addr, state)
			if e.State != "closed" && e.LastError != "" {
				detail += " (" + e.LastError + ")"
			}
		}
	}
	if !s.NextStart.IsZero() {
		detail += fmt.Sprintf("; restart in %s", s.NextStart.Sub(now).Round(100*time.Millisecond))
	}
	return detail
}

func gib(b uint64) string { return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30)) }

func gpuText(g gpu.Sample) string {
	parts := []string{}
	if g.Utilization != nil {
		parts = append(parts, fmt.Sprintf("%.0f%%", 100**g.Utilization))
	}
	if g.MemoryUsed != nil && g.MemoryTotal != nil {
		parts = append(parts, gib(*g.MemoryUsed)+" / "+gib(*g.MemoryTotal))
	}
	if g.TemperatureC != nil {
		parts = append(parts, fmt.Sprintf("%.0f°C", *g.TemperatureC))
	}
	if g.PowerW != nil {
		parts = append(parts, fmt.Sprintf("%.0f W", *g.PowerW))
	}
	return fmt.Sprintf("%d: %s", g.Index, strings.Join(parts, " "))
}

func rate(bps float64) string {
	if bps <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.3f GB/s", bps/1e9)
}

func secsText(s float64) string {
	if s <= 0 {
		return "-"
	}
	d := time.Duration(s * 1e9)
	if d < time.Second {
		return fmt.Sprintf("%.1fms", s*1000)
	}
	return d.Round(10 * time.Millisecond).String()
}

func bytesText(b int64) string {
	switch {
	case b >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(b)/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(b)/(1<<10))
	}
	return fmt.Sprintf("%d B", b)
}

// printPlacements prints each model's pipeline groups and tensor groups as
// the answering host placed them: the stages' hosts and layer ranges (or
// the ranks), the memory each host counted, or whom a split waits for.
func printPlacements(out io.Writer, models []dashboard.ModelState) {
	head := false
	for _, m := range models {
		for _, p := range m.Placements {
			if !head {
				fmt.Fprintln(out, "\nPLACEMENT")
				head = true
			}
			what := m.Name + " " + p.Role + " " + p.Shard
			if p.Groups > 0 {
				what += fmt.Sprintf(" group %d of %d", p.Group, p.Groups)
			}
			var parts []string
			for i, s := range p.Stages {
				if p.Shard == config.ShardTensor {
					parts = append(parts, fmt.Sprintf("rank %d %s", i, s.Host))
				} else {
					parts = append(parts, fmt.Sprintf("stage %d %s layers %d:%d", i, config.StageHosts(p, i), s.Start, s.End))
				}
			}
			if parts == nil {
				parts = []string{p.Note}
			}
			fmt.Fprintf(out, "%s: %s\n", what, strings.Join(parts, " · "))
			if len(p.Memory) > 0 {
				fmt.Fprintf(out, "  %s\n", config.MemoryLine(p))
			}
		}
	}
}
