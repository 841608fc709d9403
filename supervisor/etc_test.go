package supervisor

import (
	"encoding/json"
	"encoding/xml"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestSystemdUnit checks the plain unit in etc/ has what the supervisor's
// systemd integration relies on.
func TestSystemdUnit(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "etc", "systemd", "exo.service"))
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string][]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(line, "#") {
			keys[k] = append(keys[k], v)
		}
	}
	for k, want := range map[string]string{
		"Type": "notify", "NotifyAccess": "main", "ExecReload": "/bin/kill -HUP $MAINPID", "Restart": "on-failure",
		"WatchdogSec": "30", "KillMode": "mixed", "NoNewPrivileges": "yes", "ProtectSystem": "strict",
		"ExecStart":    "/usr/local/bin/exo supervise --config /etc/exo/cluster.toml",
		"ExecStartPre": "/usr/local/bin/exo config check /etc/exo/cluster.toml",
	} {
		if !slices.Contains(keys[k], want) {
			t.Errorf("%s = %q, want %q", k, keys[k], want)
		}
	}
}

func TestLaunchdPlist(t *testing.T) {
	f, err := os.Open(filepath.Join("..", "etc", "launchd", "org.exo-pd.exo.plist"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// A well-formed plist whose top dict has the keys launchd needs.
	var doc struct {
		Dict struct {
			Keys    []string `xml:"key"`
			Strings []string `xml:"string"`
			Array   struct {
				Strings []string `xml:"string"`
			} `xml:"array"`
		} `xml:"dict"`
	}
	if err := xml.NewDecoder(f).Decode(&doc); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"Label", "ProgramArguments", "RunAtLoad", "KeepAlive", "StandardErrorPath", "UserName"} {
		if !slices.Contains(doc.Dict.Keys, k) {
			t.Errorf("plist lacks %s", k)
		}
	}
	if got := strings.Join(doc.Dict.Array.Strings, " "); got != "/usr/local/bin/exo supervise --config /etc/exo/cluster.toml" {
		t.Errorf("ProgramArguments = %q", got)
	}
}

// exported lists every metric name the supervisor's /metrics carries
// (DESIGN §7 and the supervisor's own), for checking dashboards and alerts.
var exported = []string{
	"exo_time_to_first_token_seconds", "exo_inter_token_latency_seconds", "exo_request_duration_seconds",
	"exo_prompt_tokens_total", "exo_generation_tokens_total", "exo_requests_total", "exo_requests_waiting",
	"exo_requests_running", "exo_remote_prefill_total", "exo_kv_transfer_bytes_total",
	"exo_kv_transfer_duration_seconds", "exo_kv_wait_seconds", "exo_prefix_cache_hit_tokens_total",
	"exo_runner_up", "exo_runner_restarts_total", "exo_runner_crash_looping", "exo_config_last_reload_successful",
	"exo_config_last_reload_success_timestamp_seconds", "exo_gpu_utilization_ratio", "exo_gpu_memory_used_bytes",
	"exo_gpu_temperature_celsius", "exo_gpu_power_watts",
}

var metricRe = regexp.MustCompile(`\bexo_[a-z_]+`)

func checkNames(t *testing.T, where, expr string) {
	t.Helper()
	for _, name := range metricRe.FindAllString(expr, -1) {
		name = strings.TrimSuffix(name, "_bucket")
		if !slices.Contains(exported, name) {
			t.Errorf("%s: unknown metric %s in %q", where, name, expr)
		}
	}
}

func TestGrafanaDashboard(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "etc", "prometheus", "grafana-exo.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string
			Type    string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, p := range d.Panels {
		if p.Type != "row" && len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			checkNames(t, p.Title, tg.Expr)
			for _, n := range metricRe.FindAllString(tg.Expr, -1) {
				seen[strings.TrimSuffix(n, "_bucket")] = true
			}
		}
	}
	for _, want := range []string{"exo_time_to_first_token_seconds", "exo_inter_token_latency_seconds", "exo_remote_prefill_total",
		"exo_kv_transfer_bytes_total", "exo_runner_restarts_total", "exo_gpu_utilization_ratio"} {
		if !seen[want] {
			t.Errorf("dashboard does not show %s", want)
		}
	}
}

func TestPrometheusFiles(t *testing.T) {
	for _, f := range []string{"prometheus.yml", "exo-alerts.yml"} {
		b, err := os.ReadFile(filepath.Join("..", "etc", "prometheus", f))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if e, ok := strings.CutPrefix(strings.TrimSpace(line), "expr:"); ok {
				checkNames(t, f, e)
			}
		}
	}
}
