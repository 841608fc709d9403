package config

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

const twoHosts = `[cluster]
name = "t"
secret_file = "/etc/exo/secret"

[hosts.spark]
address = "127.0.0.2"
backend = "cuda"

[hosts.mac]
address = "127.0.0.3"
backend = "metal"
`

func TestInvalidFiles(t *testing.T) {
	tests := []struct {
		name string
		src  string
		want []string
	}{
		{"syntax", "[cluster\nname = 1\n", []string{
			`f.toml:1:9: expected '.' or ']' to end table name, but got '\n' instead`}},
		{"type", twoHosts + "[api]\nport = \"x\"\n", []string{
			`f.toml:13:1: port: incompatible types: TOML value has type string; destination has type integer`}},
		{"unknown keys", twoHosts + `
[api]
prot = 1

[hosts.spark.extra]
x = 1

[[models]]
name = "m"
sauce = "a"
decode = { hosts = ["mac"], source = "a", portt = 3 }
`, []string{
			`f.toml:14:1: unknown key "prot" (known keys here: listen, port, api_key_file, open_paths, cors_origins)`,
			`f.toml:16:2: unknown key "extra" (known keys here: address, backend, threads, memory_gib, rdma)`,
			`f.toml:21:1: unknown key "sauce" (known keys here: name, source, decode, prefill, remote_prefill_min_tokens, remote_prefill_route, kv_wire_dtype, kv_streams, max_queue, max_batch, prefill_chunk, prefill_connect_timeout_ms, defaults, speculative)`,
			`f.toml:22:43: unknown key "portt" (known keys here: hosts, groups, source, port, shard, layers, tensor)`,
		}},
		{"unknown host", twoHosts + `
[[models]]
name = "m"
source = "org/m"
decode = { hosts = ["mac", "studio"] }
prefill = { hosts = ["spark", "spark"] }
`, []string{
			`f.toml:16:28: model m: decode on unknown host "studio" (hosts: mac, spark)`,
			`f.toml:17:31: model m: host "spark" listed twice in prefill.hosts`,
		}},
		{"port clash", twoHosts + `
[[models]]
name = "a"
source = "org/a"
decode = { hosts = ["mac"], port = 52415 }

[[models]]
name = "b"
source = "org/b"
prefill = { hosts = ["spark"], port = 9000, metrics_port = 9000 }
decode = { hosts = ["mac"], port = 52510 }
`, []string{
			`f.toml:16:29: two runners on one port: the API gateway ([api] port) and model a decode both use port 52415 on host mac`,
			`f.toml:21:45: two runners on one port: model b prefill and model b prefill metrics both use port 9000 on host spark`,
		}},
		{"auto port clash", twoHosts + `
[[models]]
name = "a"
source = "org/a"
decode = { hosts = ["mac"] }

[[models]]
name = "b"
source = "org/b"
decode = { hosts = ["mac"], port = 52500 }
`, []string{
			`f.toml:21:29: two runners on one port: model a decode and model b decode both use port 52500 on host mac`,
		}},
		{"missing pieces", `
[api]
port = 70000

[hosts.x]
backend = "rocm"

[hosts.y]
address = "a b"

[[models]]
decode = { hosts = ["x"] }

[[models]]
name = "x"
remote_prefill_min_tokens = -1
remote_prefill_route = "fastest"
kv_wire_dtype = "fp4"
kv_streams = 17
prefill = { hosts = ["y"], source = "s" }

[[models]]
name = "x"
source = "s"
decode = { hosts = [] }
`, []string{
			`f.toml:1:1: the cluster has 2 hosts and [cluster] has no secret_file: anyone who reaches a KV port gets prefill and can feed decode runners; create one secret for all hosts (head -c 32 /dev/urandom | base64 > /etc/exo/secret), copy it to every host and set secret_file = "/etc/exo/secret" under [cluster], or write insecure = true there to run open`,
			`f.toml:3:1: api port 70000 out of range 1-65535`,
			`f.toml:5:2: host x has no address (how other hosts reach it, e.g. address = "10.0.0.10")`,
			`f.toml:6:1: host x: unknown backend "rocm" (want cuda, metal, cpu or mlx-cpu)`,
			`f.toml:8:2: host y has no backend (cuda, metal, cpu or mlx-cpu)`,
			`f.toml:9:1: host y: address "a b" is neither an IP address nor a host name`,
			`f.toml:11:3: models[0] has no name (what clients send as "model")`,
			`f.toml:12:1: models[0]: decode has no source (set source on the model or decode.source)`,
			`f.toml:14:3: model x has no decode = { hosts = [...] }: every model needs at least one decode runner`,
			`f.toml:16:1: model x: remote_prefill_min_tokens must be at least 1`,
			`f.toml:17:1: model x: remote_prefill_route "fastest": want "cost" or "floor"`,
			`f.toml:18:1: model x: kv_wire_dtype "fp4": want "fp8" (or leave it out for the cache's dtype)`,
			`f.toml:19:1: model x: kv_streams 17: want 1 to 16 (TCP connections per KV transfer)`,
			`f.toml:23:1: model "x" is defined twice (first as models[1])`,
			`f.toml:25:1: model x: decode.hosts is empty`,
		}},
		{"fp8 without prefill", `[hosts.h]
address = "127.0.0.1"
backend = "cpu"
[[models]]
name = "m"
source = "s"
kv_wire_dtype = "fp8"
decode = { hosts = ["h"] }
`, []string{
			`f.toml:7:1: model m: kv_wire_dtype needs [models.prefill] runners`,
		}},
		{"kv_streams zero, and streams without prefill", `[hosts.h]
address = "127.0.0.1"
backend = "cpu"
[[models]]
name = "m"
source = "s"
kv_streams = 0
decode = { hosts = ["h"] }
[[models]]
name = "n"
source = "s"
kv_streams = 4
decode = { hosts = ["h"] }
`, []string{
			`f.toml:7:1: model m: kv_streams 0: want 1 to 16 (TCP connections per KV transfer)`,
			`f.toml:12:1: model n: kv_streams needs [models.prefill] runners`,
		}},
		{"control character in a source", twoHosts + `
[[models]]
name = "m"
source = "org/na\u0000me"
decode = { hosts = ["mac"] }
prefill = { hosts = ["spark"], source = "org/m\n../../etc" }
`, []string{
			`f.toml:16:1: model m: decode source "org/na\x00me" has a control character`,
			`f.toml:17:1: model m: prefill source "org/m\n../../etc" has a control character`,
		}},
		{"empty", "", []string{
			`f.toml:1:1: no hosts: add at least one [hosts.NAME] table with address and backend`,
			`f.toml:1:1: no models: add at least one [[models]] table`,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse("f.toml", []byte(tt.src))
			if err == nil {
				t.Fatalf("Parse succeeded: %+v", c)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("error does not wrap ErrInvalid: %v", err)
			}
			got := strings.Split(err.Error(), "\n")
			if !slices.Equal(got, tt.want) {
				t.Errorf("errors:\n got: %s\nwant: %s", strings.Join(got, "\n      "), strings.Join(tt.want, "\n      "))
			}
		})
	}
}

func TestExampleFileIsValid(t *testing.T) {
	c, err := Load(filepath.Join("..", "..", "etc", "exo", "cluster.example.toml"))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.HostNames(); !slices.Equal(got, []string{"mini", "spark", "studio"}) {
		t.Errorf("hosts = %v", got)
	}
	spark := c.Runners("spark")
	if len(spark) != 2 || spark[0].Role != Prefill || spark[1].Role != Prefill {
		t.Fatalf("spark runners = %+v", spark)
	}
	want := []string{"runner", "prefill", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--served-name", "llama-3.1-8b",
		"--listen", "10.0.0.10:52601", "--metrics", "10.0.0.10:52602", "--secret-file", "/etc/exo/secret", "--backend", "mlx", "--device", "gpu", "--prefix-cache-mib", "4096"}
	if got := spark[0].Args(); !slices.Equal(got, want) {
		t.Errorf("spark[0] args\n got %q\nwant %q", got, want)
	}
	studio := c.Runners("studio")
	want = []string{"runner", "decode", "--model", "mlx-community/Qwen3-8B-4bit", "--served-name", "qwen3-8b",
		"--listen", "10.0.0.20:52500", "--prefill", "10.0.0.10:52501", "--prefill-health", "10.0.0.10:52502", "--remote-prefill-min-tokens", "256",
		"--secret-file", "/etc/exo/secret", "--backend", "mlx", "--device", "gpu", "--max-queue", "16"}
	if len(studio) != 2 || !slices.Equal(studio[1].Args(), want) {
		t.Errorf("studio runners = %+v\nwant second args %q", studio, want)
	}
	if got := len(c.DecodeRunners("qwen3-8b")); got != 2 {
		t.Errorf("qwen3-8b decode runners = %d, want 2", got)
	}
}

func TestDefault(t *testing.T) {
	c := Default()
	rs := c.Runners("local")
	if len(rs) != 2 {
		t.Fatalf("default runners = %+v", rs)
	}
	dec, pre := rs[0], rs[1]
	if want := []string{"runner", "decode", "--model", "builtin:smollm2", "--served-name", "smollm2-135m",
		"--listen", "127.0.0.1:52500", "--prefill", "127.0.0.1:52501", "--prefill-health", "127.0.0.1:52502", "--remote-prefill-min-tokens", "256",
		"--default-temperature", "0.2", "--default-top-p", "0.9", "--backend", "cpu"}; !slices.Equal(dec.Args(), want) {
		t.Errorf("decode args %q, want %q", dec.Args(), want)
	}
	if want := []string{"runner", "prefill", "--model", "builtin:smollm2", "--served-name", "smollm2-135m",
		"--listen", "127.0.0.1:52501", "--metrics", "127.0.0.1:52502", "--backend", "cpu"}; !slices.Equal(pre.Args(), want) {
		t.Errorf("prefill args %q, want %q", pre.Args(), want)
	}
	if c.API.Port != 52415 || c.API.Listen != "127.0.0.1" {
		t.Errorf("api = %+v", c.API)
	}
}

func TestRunnerTuning(t *testing.T) {
	c, err := Parse("f", []byte(`
[cluster]
offline = true
[hosts.h]
address = "127.0.0.1"
backend = "cpu"
threads = 2
[[models]]
name = "m"
source = "s"
prefill_chunk = 512
max_batch = 8
prefill_connect_timeout_ms = 250
remote_prefill_route = "cost"
kv_wire_dtype = "fp8"
kv_streams = 4
decode = { hosts = ["h"] }
prefill = { hosts = ["h"], prefix_cache_mib = 0 }
`))
	if err != nil {
		t.Fatal(err)
	}
	rs := c.Runners("h")
	want := [][]string{
		{"runner", "decode", "--model", "s", "--served-name", "m", "--listen", "127.0.0.1:52500", "--prefill", "127.0.0.1:52501", "--prefill-health", "127.0.0.1:52502",
			"--remote-prefill-min-tokens", "256", "--remote-prefill-route", "cost", "--kv-wire-dtype", "fp8", "--kv-streams", "4", "--prefill-connect-timeout", "250ms", "--backend", "cpu", "--max-batch", "8", "--prefill-chunk", "512", "--threads", "2", "--offline"},
		{"runner", "prefill", "--model", "s", "--served-name", "m", "--listen", "127.0.0.1:52501", "--metrics", "127.0.0.1:52502",
			"--backend", "cpu", "--prefill-chunk", "512", "--prefix-cache-mib", "0", "--threads", "2", "--offline"},
	}
	for i, r := range rs {
		if !slices.Equal(r.Args(), want[i]) {
			t.Errorf("%s args\n got %q\nwant %q", r.Name, r.Args(), want[i])
		}
	}
	_, err = Parse("f", []byte(`
[hosts.h]
address = "127.0.0.1"
backend = "cpu"
threads = -1
[[models]]
name = "m"
source = "s"
prefill_chunk = -5
decode = { hosts = ["h"] }
prefill = { hosts = ["h"], prefix_cache_mib = -1 }
max_batch = 1000
prefill_connect_timeout_ms = -1
`))
	want2 := "f:5:1: host h: threads must not be negative\n" +
		"f:9:1: model m: prefill_chunk must not be negative\n" +
		"f:11:28: model m: prefix_cache_mib must not be negative (0 turns the cache off)\n" +
		"f:12:1: model m: max_batch must be between 0 (the runner's default) and 256\n" +
		"f:13:1: model m: prefill_connect_timeout_ms must be between 0 (the runner's default, 1000) and 60000"
	if err == nil || err.Error() != want2 {
		t.Errorf("errors:\n%v\nwant:\n%s", err, want2)
	}
}

func TestDiff(t *testing.T) {
	base := twoHosts + `
[[models]]
name = "a"
source = "org/a"
decode = { hosts = ["mac"] }
prefill = { hosts = ["spark"] }

[[models]]
name = "b"
source = "org/b"
decode = { hosts = ["mac"] }
`
	parse := func(s string) *Config {
		t.Helper()
		c, err := Parse("f", []byte(s))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	names := func(rs []Runner) string {
		var s []string
		for _, r := range rs {
			s = append(s, r.Host+"/"+r.Name)
		}
		return strings.Join(s, ",")
	}
	old := parse(base)
	tests := []struct {
		name                       string
		src                        string
		host                       string
		start, stop, restart, keep string
	}{
		{"same", base, "mac", "", "", "", "a-decode,b-decode"},
		{"comment only", base + "# hello\n", "spark", "", "", "", "a-prefill"},
		{"move decode of b", strings.Replace(base, `name = "b"
source = "org/b"
decode = { hosts = ["mac"] }`, `name = "b"
source = "org/b"
decode = { hosts = ["spark"] }`, 1), "spark", "spark/b-decode", "", "", "a-prefill"},
		{"move decode of b (mac side)", strings.Replace(base, `source = "org/b"
decode = { hosts = ["mac"] }`, `source = "org/b"
decode = { hosts = ["spark"] }`, 1), "mac", "", "mac/b-decode", "", "a-decode"},
		{"new source restarts", strings.Replace(base, `"org/b"`, `"org/b2"`, 1), "mac", "", "", "mac/b-decode", "a-decode"},
		{"threshold restarts decode only", strings.Replace(base, `prefill = { hosts = ["spark"] }`, "prefill = { hosts = [\"spark\"] }\nremote_prefill_min_tokens = 9", 1), "spark", "", "", "", "a-prefill"},
		{"threshold restarts decode", strings.Replace(base, `prefill = { hosts = ["spark"] }`, "prefill = { hosts = [\"spark\"] }\nremote_prefill_min_tokens = 9", 1), "mac", "", "", "mac/a-decode", "b-decode"},
		{"secret restarts all", strings.Replace(base, `secret_file = "/etc/exo/secret"`, `secret_file = "/s"`, 1), "mac", "", "", "mac/a-decode,mac/b-decode", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ch := Diff(old.Runners(tt.host), parse(tt.src).Runners(tt.host))
			if got := names(ch.Start); got != tt.start {
				t.Errorf("start = %q, want %q", got, tt.start)
			}
			if got := names(ch.Stop); got != tt.stop {
				t.Errorf("stop = %q, want %q", got, tt.stop)
			}
			if got := names(ch.Restart); got != tt.restart {
				t.Errorf("restart = %q, want %q", got, tt.restart)
			}
			if got := strings.Join(ch.Keep, ","); got != tt.keep {
				t.Errorf("keep = %q, want %q", got, tt.keep)
			}
		})
	}
}

func TestIdentify(t *testing.T) {
	c, err := Parse("f", []byte(twoHosts+"[[models]]\nname=\"m\"\nsource=\"s\"\ndecode={hosts=[\"mac\"]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		flag, hostname string
		addrs          []string
		want, wantErr  string
	}{
		{"spark", "mac", nil, "spark", ""},
		{"", "mac", nil, "mac", ""},
		{"", "mac.lan", nil, "mac", ""},
		{"", "other", []string{"127.0.0.1", "127.0.0.2"}, "spark", ""},
		{"nope", "mac", nil, "", `this host is not in the cluster file: --host "nope" is not one of f's hosts (mac, spark)`},
		{"", "other", []string{"10.1.1.1"}, "", `this host is not in the cluster file: --host not given, hostname "other" names no [hosts.*] entry of f, and no host's address is local (hosts: mac, spark); pass --host NAME`},
		{"", "other", []string{"127.0.0.2", "127.0.0.3"}, "", `this host is not in the cluster file: several hosts have a local address (mac, spark); pass --host NAME`},
	}
	for _, tt := range tests {
		var ips []net.IP
		for _, a := range tt.addrs {
			ips = append(ips, net.ParseIP(a))
		}
		got, err := c.Identify(tt.flag, tt.hostname, ips)
		if tt.wantErr != "" {
			if err == nil || err.Error() != tt.wantErr || !errors.Is(err, ErrUnknownHost) {
				t.Errorf("Identify(%q,%q,%v) err = %v, want %q", tt.flag, tt.hostname, tt.addrs, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("Identify(%q,%q,%v) = %q, %v; want %q", tt.flag, tt.hostname, tt.addrs, got, err, tt.want)
		}
	}
}

func FuzzParse(f *testing.F) {
	ex, _ := os.ReadFile(filepath.Join("..", "..", "etc", "exo", "cluster.example.toml"))
	f.Add(ex)
	f.Add([]byte(DefaultText()))
	f.Add([]byte(twoHosts))
	f.Add([]byte(threeMacs + "[[models]]\nname = \"m\"\nsource = \"s\"\ndecode = { hosts = [\"m1\", \"m2\", \"m3\"], shard = \"tensor\" }\n"))
	f.Add([]byte("[[models]]\ndecode={hosts=[\"a\",{x=1}]}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse("fuzz", data)
		if err == nil {
			for _, h := range c.HostNames() {
				for _, r := range c.Runners(h) {
					_ = r.Args()
				}
			}
		}
	})
}

func TestSamplingDefaultsAndCORS(t *testing.T) {
	c, err := Parse("f", []byte(twoHosts+`
[api]
cors_origins = ["https://app.example", "http://localhost:3000"]

[[models]]
name = "m"
source = "org/m-4bit"
decode = { hosts = ["mac"] }
[models.defaults]
temperature = 0.6
top_k = 20
`))
	if err != nil {
		t.Fatal(err)
	}
	args := strings.Join(c.Runners("mac")[0].Args(), " ")
	if !strings.Contains(args, "--default-temperature 0.6 --default-top-k 20") || strings.Contains(args, "--default-top-p") {
		t.Fatalf("args %s", args)
	}
	if len(c.API.CORSOrigins) != 2 {
		t.Fatalf("cors %v", c.API.CORSOrigins)
	}
	for _, bad := range []struct{ src, want string }{
		{"[models.defaults]\ntemperature = 3\n", "f:18:1: model m: defaults.temperature must be between 0 and 2, got 3"},
		{"[models.defaults]\ntop_p = 0.0\n", "f:18:1: model m: defaults.top_p must be in (0, 1], got 0"},
		{"[models.defaults]\ntop_k = -2\n", "f:18:1: model m: defaults.top_k must be -1 or 0 (off) or positive, got -2"},
		{"[models.defaults]\nseed = 1\n", `f:18:1: unknown key "seed" (known keys here: temperature, top_p, top_k, min_p, repetition_penalty)`},
	} {
		_, err := Parse("f", []byte(twoHosts+"\n[[models]]\nname = \"m\"\nsource = \"org/m-4bit\"\ndecode = { hosts = [\"mac\"] }\n"+bad.src))
		if err == nil || err.Error() != "invalid cluster file: "+bad.want && !strings.Contains(err.Error(), bad.want) {
			t.Errorf("got %v, want %s", err, bad.want)
		}
	}
	_, err = Parse("f", []byte(twoHosts+"[api]\ncors_origins = [\"app.example/path\"]\n"))
	if err == nil || !strings.Contains(err.Error(), "cors_origins[0]") {
		t.Errorf("bad origin: %v", err)
	}
}

// TestSpeculative: [models.speculative] reaches the decode runners as
// --speculative and --speculative-tokens (never the prefill runners);
// mode "draft" passes --draft; a draft without that mode (or that mode
// without one), unknown modes and out-of-range tokens are refused by name.
func TestSpeculative(t *testing.T) {
	c, err := Parse("f", []byte(twoHosts+`
[[models]]
name = "m"
source = "org/m-4bit"
decode = { hosts = ["mac"] }
prefill = { hosts = ["spark"] }
[models.speculative]
mode = "prompt-lookup"
tokens = 6
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range c.HostNames() {
		for _, r := range c.Runners(h) {
			args := strings.Join(r.Args(), " ")
			has := strings.Contains(args, "--speculative prompt-lookup --speculative-tokens 6")
			if has != (r.Role == Decode) || (r.Role == Prefill && strings.Contains(args, "--speculative")) {
				t.Errorf("%s runner args %s", r.Role, args)
			}
		}
	}
	c, err = Parse("f", []byte(twoHosts+"\n[[models]]\nname = \"m\"\nsource = \"org/m-4bit\"\ndecode = { hosts = [\"mac\"] }\n"+
		"[models.speculative]\nmode = \"draft\"\ndraft = \"org/small-4bit\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if args := strings.Join(c.Runners("mac")[0].Args(), " "); !strings.Contains(args, "--speculative draft --draft org/small-4bit") {
		t.Errorf("draft mode's runner args %s", args)
	}
	c, err = Parse("f", []byte(twoHosts+"\n[[models]]\nname = \"m\"\nsource = \"org/m-4bit\"\ndecode = { hosts = [\"mac\"] }\n"))
	if err != nil {
		t.Fatal(err)
	}
	if args := strings.Join(c.Runners("mac")[0].Args(), " "); strings.Contains(args, "--speculative") {
		t.Errorf("speculation flags without [models.speculative]: %s", args)
	}
	for _, bad := range []struct{ src, want string }{
		{"[models.speculative]\nmode = \"draft\"\n", `model m: speculative.draft "" with mode "draft": draft names the draft model`},
		{"[models.speculative]\nmode = \"draft\"\ndraft = \"org/x\\u0007\"\n", `model m: speculative.draft "org/x\a" has a control character`},
		{"[models.speculative]\nmode = \"ngram\"\n", `model m: speculative.mode "ngram": want "off", "prompt-lookup" or "draft"`},
		{"[models.speculative]\nmode = \"prompt-lookup\"\ntokens = 65\n", "model m: speculative.tokens 65: want 1 to 64"},
		{"[models.speculative]\nmode = \"prompt-lookup\"\ndraft = \"org/small\"\n", `model m: speculative.draft "org/small" with mode "prompt-lookup"`},
		{"[models.speculative]\nk = 3\n", `unknown key "k" (known keys here: mode, tokens, draft)`},
		{"[models.speculative]\ntokens = 6\n", `model m: speculative.tokens 6 with mode "": tokens bounds the drafts`},
		{"[models.speculative]\nmode = \"off\"\ntokens = 6\n", `model m: speculative.tokens 6 with mode "off"`},
	} {
		_, err := Parse("f", []byte(twoHosts+"\n[[models]]\nname = \"m\"\nsource = \"org/m-4bit\"\ndecode = { hosts = [\"mac\"] }\n"+bad.src))
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("got %v, want %s", err, bad.want)
		}
	}
}

// The secure defaults: a cluster reachable beyond loopback needs a secret
// (or an explicit insecure = true); quantized sources are accepted on every
// backend; [api] api_key_file and open_paths are checked.
func TestSecureDefaults(t *testing.T) {
	const models = `
[[models]]
name = "m"
decode = { hosts = ["mac"], source = "mlx-community/Qwen3-8B-4bit" }
prefill = { hosts = ["spark"], source = "mlx-community/Qwen3-8B-4bit" }
`
	open := strings.Replace(twoHosts, "secret_file = \"/etc/exo/secret\"\n", "", 1)
	oneHost := func(addr string) string {
		return "[cluster]\nname = \"t\"\n\n[hosts.mac]\naddress = \"" + addr + "\"\nbackend = \"metal\"\n\n[[models]]\nname = \"m\"\nsource = \"org/m\"\ndecode = { hosts = [\"mac\"] }\n"
	}
	tests := []struct {
		name, src, want string // want: "" = valid, else a substring of the error
	}{
		{"quantized prefill on cuda with secret", twoHosts + models, ""},
		{"two hosts without secret", open + models, "f.toml:1:2: the cluster has 2 hosts and [cluster] has no secret_file"},
		{"two hosts, insecure written out", strings.Replace(open, `name = "t"`, "name = \"t\"\ninsecure = true", 1) + models, ""},
		{"one host on loopback, no secret", oneHost("127.0.0.1"), ""},
		{"one host on localhost, no secret", oneHost("localhost"), ""},
		{"one host on the LAN, no secret", oneHost("10.0.0.20"), "host mac listens on 10.0.0.20, beyond loopback, and [cluster] has no secret_file"},
		{"api key file", twoHosts + "[api]\napi_key_file = \"/etc/exo/api-key\"\nopen_paths = [\"/health\"]\n" + models, ""},
		{"relative api key file", twoHosts + "[api]\napi_key_file = \"api-key\"\n" + models, `f.toml:13:1: api_key_file "api-key" must be an absolute path`},
		{"open path not allowed", twoHosts + "[api]\nopen_paths = [\"/metrics\", \"/v1/models\"]\n" + models, `f.toml:13:27: open_paths: "/v1/models" cannot be served without the API key (allowed: /health, /metrics)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("f.toml", []byte(tt.src))
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("want valid, got %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("error %v\nwant it to contain %q", err, tt.want)
			}
		})
	}
	c, err := Parse("f.toml", []byte(twoHosts+models))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.API.OpenPaths, []string{"/health", "/metrics"}) {
		t.Errorf("default open_paths = %q", c.API.OpenPaths)
	}
	c, err = Parse("f.toml", []byte(twoHosts+"[api]\nopen_paths = []\n"+models))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.API.OpenPaths) != 0 {
		t.Errorf("open_paths = [] gave %q", c.API.OpenPaths)
	}
}

// [supervisor] sets the liveness limits: Go durations, negative = off, 0
// and non-durations refused at their file:line:col, unknown keys named.
func TestSupervisorLiveness(t *testing.T) {
	const model = "\n[[models]]\nname = \"m\"\nsource = \"org/m\"\ndecode = { hosts = [\"mac\"] }\n"
	c, err := Parse("f.toml", []byte(twoHosts+"[supervisor]\nliveness_timeout = \"3s\"\nliveness_starting_timeout = \"-1s\"\n"+model))
	if err != nil {
		t.Fatal(err)
	}
	if c.Supervisor.Liveness != 3*time.Second || c.Supervisor.LivenessStarting != -time.Second {
		t.Errorf("liveness %v, starting %v", c.Supervisor.Liveness, c.Supervisor.LivenessStarting)
	}
	c, err = Parse("f.toml", []byte(twoHosts+model))
	if err != nil {
		t.Fatal(err)
	}
	if c.Supervisor.Liveness != 0 || c.Supervisor.LivenessStarting != 0 {
		t.Errorf("unset gave %v, %v; want 0 (the supervisor's defaults)", c.Supervisor.Liveness, c.Supervisor.LivenessStarting)
	}
	for _, tt := range []struct{ src, want string }{
		{"liveness_timeout = \"10\"\n", `f.toml:13:1: liveness_timeout "10" is not a duration`},
		{"liveness_timeout = \"0s\"\n", "f.toml:13:1: liveness_timeout must not be 0"},
		{"x = 1\nliveness_starting_timeout = \"soon\"\n", `f.toml:14:1: liveness_starting_timeout "soon" is not a duration`},
		{"liveness = \"5s\"\n", `f.toml:13:1: unknown key "liveness" (known keys here: liveness_timeout, liveness_starting_timeout)`},
		{"liveness_timeout = 10\n", "liveness_timeout"},
	} {
		_, err := Parse("f.toml", []byte(twoHosts+"[supervisor]\n"+tt.src+model))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: got %v, want %q", tt.src, err, tt.want)
		}
	}
}

// TestKnownKeysHint: the keys an "unknown key" error lists as known are
// every key the file may hold there (the decoder's toml tags), so a typo's
// hint never hides the key that was meant (it left out rdma).
func TestKnownKeysHint(t *testing.T) {
	tags := func(v any) []string {
		var ks []string
		rt := reflect.TypeOf(v)
		for i := range rt.NumField() {
			if k, _, _ := strings.Cut(rt.Field(i).Tag.Get("toml"), ","); k != "" && k != "-" {
				ks = append(ks, k)
			}
		}
		slices.Sort(ks)
		return ks
	}
	sorted := func(kss ...[]string) []string {
		var ks []string
		for _, s := range kss {
			for _, k := range s {
				if !slices.Contains(ks, k) {
					ks = append(ks, k)
				}
			}
		}
		slices.Sort(ks)
		return ks
	}
	for _, tt := range []struct {
		table string
		known []string
		v     any
	}{
		{"(top)", knownKeys[""], Config{}},
		{"cluster", knownKeys["cluster"], Cluster{}},
		{"api", knownKeys["api"], API{}},
		{"supervisor", knownKeys["supervisor"], Supervisor{}},
		{"hosts.*", knownKeys["hosts.*"], Host{}},
		{"models", knownKeys["models"], Model{}},
		{"models.defaults", knownKeys["models.defaults"], SamplingDefaults{}},
		{"models.speculative", knownKeys["models.speculative"], Speculative{}},
		// decode and prefill share Role; each lists the keys its role takes.
		{"models.decode + models.prefill", sorted(knownKeys["models.decode"], knownKeys["models.prefill"]), Role{}},
	} {
		if got, want := sorted(tt.known), tags(tt.v); !slices.Equal(got, want) {
			t.Errorf("[%s] known keys %v, the decoder takes %v", tt.table, got, want)
		}
	}
}
