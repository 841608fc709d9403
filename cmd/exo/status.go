package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/exo-pd/exo-pd/supervisor"
	"github.com/exo-pd/exo-pd/supervisor/config"
	"github.com/exo-pd/exo-pd/supervisor/gateway"
	"github.com/exo-pd/exo-pd/supervisor/process"
)

// cmdStatus asks a running supervisor what it is doing: `exo status [--api URL] [--json]`.
func cmdStatus(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	api := fs.String("api", "", "the supervisor's API URL (default: from "+config.DefaultPath+", else http://127.0.0.1:52415)")
	asJSON := fs.Bool("json", false, "print the raw JSON")
	if err := parseFlags(fs, "usage: exo status [--api URL] [--json]\n\nShows what the supervisor on this host is doing: its runners, hosts, and the\ndecode runners as its gateway sees them.", args); err != nil {
		return err
	}
	url := *api
	var key []byte // the gateway's API key, when the cluster file names one we can read
	c, cerr := config.Load(config.DefaultPath)
	if cerr == nil && c.API.APIKeyFile != "" {
		key, _ = gateway.ReadKeyFile(c.API.APIKeyFile)
	}
	if url == "" {
		port := config.DefaultAPIPort
		if cerr == nil {
			port = c.API.Port
		}
		url = "http://127.0.0.1:" + strconv.Itoa(port)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(url, "/")+supervisor.StatusPath, nil)
	if err != nil {
		return exitError{2, err.Error()}
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
	if *asJSON {
		_, err := os.Stdout.Write(body)
		return err
	}
	var st supervisor.Status
	if err := json.Unmarshal(body, &st); err != nil {
		return fmt.Errorf("decode status: %w", err)
	}
	printStatus(os.Stdout, st, time.Now())
	return nil
}

func printStatus(out io.Writer, st supervisor.Status, now time.Time) {
	fmt.Fprintf(out, "cluster %s, host %s, up %s\nconfig  %s\napi     %s/v1\n", st.Cluster, st.Host, now.Sub(st.Started).Round(time.Second), st.Config, st.API)
	rl := st.LastReload
	if rl.OK {
		fmt.Fprintf(out, "reload  ok at %s (%s)\n", rl.At.Format(time.RFC3339), rl.Changes)
	} else {
		first, _, _ := strings.Cut(rl.Error, "\n")
		fmt.Fprintf(out, "reload  FAILED at %s, previous config still running: %s\n", rl.At.Format(time.RFC3339), first)
	}
	fmt.Fprintln(out, "\nRUNNERS ON THIS HOST")
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tROLE\tSTATE\tPID\tRESTARTS\tADDRESS\tDETAIL")
	for _, r := range st.Runners {
		detail := r.Status.LastExit
		if e := r.Status.LastError; e != "" && r.Status.State != process.Ready {
			detail += ": " + e
		}
		if h := r.Status.Health; h != nil {
			switch {
			case h.Status == "loading":
				detail = fmt.Sprintf("loading/downloading %.0f%%", 100*h.Progress)
			case h.Status == "ok":
				detail = fmt.Sprintf("waiting %d, running %d", h.Waiting, h.Running)
				if r.Status.Restarts > 0 && r.Status.LastExit != "" {
					detail += "; last restart: " + r.Status.LastExit
				}
			case h.Status != "":
				detail = h.Status
			}
			for _, e := range h.PrefillEndpoints {
				detail += fmt.Sprintf("; prefill %s %s", e.Addr, e.State)
				if e.State != "closed" && e.LastError != "" {
					detail += " (" + e.LastError + ")"
				}
			}
		}
		if !r.Status.NextStart.IsZero() {
			detail += fmt.Sprintf("; restart in %s", r.Status.NextStart.Sub(now).Round(100*time.Millisecond))
		}
		pid := "-"
		if r.Status.PID > 0 {
			pid = strconv.Itoa(r.Status.PID)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", r.Spec.Name, r.Spec.Role, r.Status.State, pid, r.Status.Restarts, r.Spec.HealthAddr(), detail)
	}
	tw.Flush()
	fmt.Fprintln(out, "\nHOSTS")
	tw = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	for _, h := range st.Hosts {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", h.Name, h.Address, h.Backend, strings.Join(h.Runners, ", "))
	}
	tw.Flush()
	if len(st.Decode) > 0 {
		fmt.Fprintln(out, "\nDECODE RUNNERS AS THE GATEWAY SEES THEM")
		addrs := make([]string, 0, len(st.Decode))
		for a := range st.Decode {
			addrs = append(addrs, a)
		}
		sort.Strings(addrs)
		tw = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		for _, a := range addrs {
			h := st.Decode[a]
			state := "down: " + h.Status
			if h.OK {
				state = fmt.Sprintf("ok (waiting %d, running %d)", h.Waiting, h.Running)
			}
			fmt.Fprintf(tw, "%s\t%s\n", a, state)
		}
		tw.Flush()
	}
}
