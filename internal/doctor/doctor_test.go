package doctor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/cpu"
	"github.com/exo-pd/exo-pd/runners/engine/mlx"
	"github.com/exo-pd/exo-pd/runners/engine/testmodel"
	"github.com/exo-pd/exo-pd/runners/kvwire"
	"github.com/exo-pd/exo-pd/supervisor"
	"github.com/exo-pd/exo-pd/supervisor/config"
	"github.com/exo-pd/exo-pd/supervisor/gpu"

	"github.com/exo-pd/exo-pd/internal/testutil"
)

func TestWeightBytes(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "model-00001.safetensors"), make([]byte, 300), 0o644)
	os.WriteFile(filepath.Join(dir, "model-00002.safetensors"), make([]byte, 200), 0o644)
	os.WriteFile(filepath.Join(dir, "tokenizer.json"), make([]byte, 999), 0o644)
	gguf := filepath.Join(dir, "m.gguf")
	os.WriteFile(gguf, make([]byte, 123), 0o644)
	empty := t.TempDir()
	for _, tt := range []struct {
		path string
		want int64
		err  bool
	}{{dir, 500, false}, {gguf, 123, false}, {empty, 0, true}, {filepath.Join(dir, "none"), 0, true}} {
		got, err := weightBytes(tt.path)
		if got != tt.want || (err != nil) != tt.err {
			t.Errorf("weightBytes(%s) = %d, %v; want %d (error %v)", tt.path, got, err, tt.want, tt.err)
		}
	}
}

func TestKVFailureFix(t *testing.T) {
	for _, tt := range []struct {
		err        error
		secretFile string
		want       string
	}{
		{fmt.Errorf("x: %w", kvwire.ErrAuth), "/etc/exo/secret", "the secrets differ: copy /etc/exo/secret from spark"},
		{kvwire.ErrAuth, "", "this host has none"},
		{kvwire.ErrMismatch, "/s", "predates the link probe"},
		{errors.New("connection refused"), "/s", "does not answer on the KV wire"},
	} {
		c := kvFailure("KV wire", "spark", tt.secretFile, tt.err)
		if c.Status != Fail || !strings.Contains(c.Fix, tt.want) {
			t.Errorf("%v: %+v, want a fix containing %q", tt.err, c, tt.want)
		}
	}
}

// testCluster writes a two-host cluster file (north at 127.0.0.2 with the
// prefill runner, south at 127.0.0.3 with decode) and loads it as host.
func testCluster(t *testing.T, host, extra string) *Env {
	t.Helper()
	dir := t.TempDir()
	model := filepath.Join(dir, "model")
	os.MkdirAll(model, 0o755)
	os.WriteFile(filepath.Join(model, "model.safetensors"), make([]byte, 4096), 0o644)
	if !strings.Contains(extra, "secret_file") && !strings.Contains(extra, "insecure") {
		extra = "insecure = true\n" + extra
	}
	text := fmt.Sprintf(`[cluster]
name = "t"
runner_port_base = %d
models_dir = %q
%s
[hosts.north]
address = "127.0.0.2"
backend = "cpu"

[hosts.south]
address = "127.0.0.3"
backend = "cpu"

[[models]]
name = "tiny"
source = %q
decode = { hosts = ["south"] }
prefill = { hosts = ["north"] }
`, freePort(t), dir, extra, model)
	path := filepath.Join(dir, "cluster.toml")
	os.WriteFile(path, []byte(text), 0o644)
	env, rs := Load(Options{Path: path, Host: host, Timeout: 2 * time.Second})
	if env == nil {
		t.Fatalf("load: %+v", rs)
	}
	return env
}

// freePort returns the first of a block of ports free a moment ago, outside
// the kernel's ephemeral range (testutil.Ports: no outgoing connection on a
// busy machine takes one before the server binds it), wide enough for a
// runner_port_base of a few models (config.PortsPerModel apart).
func freePort(t *testing.T) int {
	t.Helper()
	return testutil.Ports(t, 40)
}

// expect finds the result named with prefix name and checks its status and
// that its fix (or detail, for ok) contains want.
func expect(t *testing.T, rs []Result, name, status, want string) {
	t.Helper()
	for _, r := range rs {
		if strings.HasPrefix(r.Name, name) {
			if r.Status != status || !strings.Contains(r.Fix+r.Detail, want) {
				t.Errorf("%s: %+v, want %s with %q", name, r, status, want)
			}
			return
		}
	}
	t.Errorf("no result %q in %+v", name, rs)
}

func TestLoad(t *testing.T) {
	_, rs := Load(Options{Path: filepath.Join(t.TempDir(), "none.toml")})
	expect(t, rs, "cluster file", Fail, "write the cluster file")
	bad := filepath.Join(t.TempDir(), "bad.toml")
	os.WriteFile(bad, []byte("[cluster]\nnmae = 1\n"), 0o644)
	_, rs = Load(Options{Path: bad})
	expect(t, rs, "cluster file", Fail, "edit the file")
	env := testCluster(t, "south", "")
	if env.Host != "south" || env.Digest == "" {
		t.Errorf("env %+v", env)
	}
	e, rs := Load(Options{Embedded: true})
	if e == nil || e.Host != "local" {
		t.Fatalf("embedded: %+v", rs)
	}
}

func TestFiles(t *testing.T) {
	dir := t.TempDir()
	secret, empty, key := filepath.Join(dir, "secret"), filepath.Join(dir, "empty"), filepath.Join(dir, "key")
	os.WriteFile(secret, []byte("s3cret\n"), 0o600)
	os.WriteFile(empty, nil, 0o600)
	os.WriteFile(key, []byte("k3y\n"), 0o600)
	for _, tt := range []struct {
		name, extra string
		want        []Result
		secret, key string
	}{
		{"secret ok", fmt.Sprintf("secret_file = %q", secret), []Result{{Name: "secret file", Status: OK}}, "s3cret", ""},
		{"secret empty", fmt.Sprintf("secret_file = %q", empty), []Result{{Name: "secret file", Status: Fail}}, "", ""},
		{"secret missing", fmt.Sprintf("secret_file = %q", filepath.Join(dir, "none")), []Result{{Name: "secret file", Status: Fail}}, "", ""},
		{"insecure", "insecure = true", []Result{{Name: "secret file", Status: Warn}}, "", ""},
		{"api key", fmt.Sprintf("insecure = true\n[api]\napi_key_file = %q", key), []Result{{Name: "secret file", Status: Warn}, {Name: "api key file", Status: OK}}, "", "k3y"},
		{"api key missing", fmt.Sprintf("insecure = true\n[api]\napi_key_file = %q", filepath.Join(dir, "none")), []Result{{Name: "secret file", Status: Warn}, {Name: "api key file", Status: Fail}}, "", ""},
	} {
		env := testCluster(t, "south", tt.extra)
		rs := Files{}.Run(context.Background(), env)
		if len(rs) != len(tt.want) {
			t.Errorf("%s: %+v", tt.name, rs)
			continue
		}
		for i, r := range rs {
			if r.Name != tt.want[i].Name || r.Status != tt.want[i].Status || (r.Status != OK && r.Fix == "") {
				t.Errorf("%s: %+v, want %+v with a fix", tt.name, r, tt.want[i])
			}
		}
		if string(env.Secret) != tt.secret || string(env.Key) != tt.key {
			t.Errorf("%s: secret %q key %q", tt.name, env.Secret, env.Key)
		}
	}
}

func TestNVML(t *testing.T) {
	env := testCluster(t, "south", "")
	if rs := (NVML{}).Run(context.Background(), env); len(rs) != 0 {
		t.Errorf("cpu host: %+v", rs)
	}
	h := env.Config.Hosts["south"]
	h.Backend = config.CUDA
	env.Config.Hosts["south"] = h
	dev := gpu.Device{Name: "H", MemoryTotal: 8 << 30, MemoryFree: 4 << 30}
	for _, tt := range []struct {
		name   string
		sys    gpu.System
		ok     bool
		err    error
		status string
		want   string
	}{
		{"no nvml", gpu.System{}, false, nil, Fail, "install the NVIDIA driver"},
		{"error", gpu.System{}, true, errors.New("boom"), Fail, "nvidia-smi"},
		{"no gpu", gpu.System{Driver: "580", CUDA: 13000}, true, nil, Fail, "sees no GPU"},
		{"cuda 12", gpu.System{Driver: "550", CUDA: 12040, Devices: []gpu.Device{dev}}, true, nil, Fail, "CUDA 13"},
		{"ok", gpu.System{Driver: "580", CUDA: 13000, Devices: []gpu.Device{dev}}, true, nil, OK, "driver 580, CUDA 13.0; H (8 GiB, 4 free)"},
	} {
		rs := NVML{System: func() (gpu.System, bool, error) { return tt.sys, tt.ok, tt.err }}.Run(context.Background(), env)
		t.Run(tt.name, func(t *testing.T) { expect(t, rs, "nvidia driver", tt.status, tt.want) })
	}
}

func TestMLX(t *testing.T) {
	env := testCluster(t, "south", "")
	ctx := context.Background()
	expect(t, MLX{Mode: "auto"}.Run(ctx, env), "mlx", Skip, "does not use MLX")
	expect(t, MLX{Mode: "off"}.Run(ctx, env), "mlx", Skip, "")
	fail := func(err error) func(string) (engine.Backend, error) {
		return func(string) (engine.Backend, error) { return nil, err }
	}
	expect(t, MLX{Mode: "on", Open: fail(errors.New("no libmlxc"))}.Run(ctx, env), "mlx", Fail, "EXO_MLXC_PATH")
	expect(t, MLX{Mode: "on", Open: fail(fmt.Errorf("x: %w", mlx.ErrDevice))}.Run(ctx, env), "mlx", Fail, "sees no GPU")
	// The cpu backend stands in for MLX: its matmul equals itself.
	var device string
	rs := MLX{Mode: "on", Open: func(d string) (engine.Backend, error) { device = d; return cpu.New(1), nil },
		Describe: func(engine.Backend) (mlx.Info, bool) {
			return mlx.Info{Version: "0.31.1", Device: "cpu", Lib: "/x", QuantizedMatmul: errors.New("no qmm")}, true
		}}.Run(ctx, env)
	if device != "cpu" {
		t.Errorf("opened device %q on a cpu host", device)
	}
	expect(t, rs, "mlx quantized matmul", Warn, "dequantized")
	expect(t, rs, "mlx matmul", OK, "equals the cpu backend's")
	expect(t, rs, "mlx", OK, "MLX 0.31.1 on cpu (/x)")
}

func TestDisk(t *testing.T) {
	env := testCluster(t, "south", "")
	rs := Disk{}.Run(context.Background(), env)
	if len(rs) != 1 || rs[0].Name != "model store disk" || rs[0].Data["free_gib"] == nil || (rs[0].Status != OK && rs[0].Status != Warn) {
		t.Errorf("%+v", rs)
	}
}

func TestMemory(t *testing.T) {
	env := testCluster(t, "south", "") // the decode runner's weights: 4096 bytes
	for _, tt := range []struct {
		avail  uint64
		status string
		want   string
	}{{1 << 20, OK, "weights 0.0 GiB"}, {5000, Warn, "little room"}, {4200, Fail, "nearly fill"}} {
		rs := Memory{Available: func(*Env) (uint64, string, error) { return tt.avail, "test memory", nil }}.Run(context.Background(), env)
		expect(t, rs, "memory", tt.status, tt.want)
	}
	rs := Memory{Available: func(*Env) (uint64, string, error) { return 0, "", errors.New("unknown") }}.Run(context.Background(), env)
	expect(t, rs, "memory", Warn, "unknown")
	os.RemoveAll(env.Config.Runners("south")[0].Source)
	rs = Memory{}.Run(context.Background(), env)
	expect(t, rs, "memory", Skip, "no weights on disk yet")
}

func TestLocalPorts(t *testing.T) {
	env := testCluster(t, "north", "")
	rs := LocalPorts{}.Run(context.Background(), env)
	if env.LocalRunning || len(rs) == 0 {
		t.Fatalf("%+v", rs)
	}
	for _, r := range rs {
		if r.Status != OK {
			t.Skipf("127.0.0.2 is not usable here: %+v", r)
		}
	}
	squat, err := net.Listen("tcp", env.Config.Runners("north")[0].Listen)
	if err != nil {
		t.Fatal(err)
	}
	defer squat.Close()
	rs = LocalPorts{}.Run(context.Background(), env)
	expect(t, rs, "port "+squat.Addr().String(), Fail, "is taken")
}

// serveCluster answers the supervisor's cluster endpoint at addr as host.
func serveCluster(t *testing.T, addr string, info supervisor.ClusterInfo) {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("%s: %v", addr, err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != supervisor.ClusterPath {
			http.NotFound(w, r)
			return
		}
		info.Time = time.Now()
		json.NewEncoder(w).Encode(info)
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
}

// Issue 30: two supervisors on one machine, the first holding the
// other's address: its answer names another host, and doctor says so
// instead of reporting the peer healthy.
func TestPeersIdentity(t *testing.T) {
	env := testCluster(t, "south", "")
	env.Config.API.Port = freePort(t)
	api := net.JoinHostPort("127.0.0.2", strconv.Itoa(env.Config.API.Port))
	serveCluster(t, api, supervisor.ClusterInfo{Cluster: "t", Host: "south", Digest: env.Digest})
	rs := Peers{}.Run(context.Background(), env)
	expect(t, rs, "host north: identity", Fail, `is host "south"'s, not north's`)
	expect(t, rs, "host north: identity", Fail, "two supervisors share this address")
	for _, r := range rs {
		if strings.HasSuffix(r.Name, ": cluster file") || strings.HasSuffix(r.Name, ": clock") {
			t.Errorf("the wrong supervisor's answer was taken for north's: %+v", r)
		}
	}
}

func TestPeersHealthy(t *testing.T) {
	env := testCluster(t, "south", "")
	env.Config.API.Port = freePort(t)
	serveCluster(t, net.JoinHostPort("127.0.0.2", strconv.Itoa(env.Config.API.Port)), supervisor.ClusterInfo{Cluster: "t", Host: "north", Digest: env.Digest})
	rs := Peers{}.Run(context.Background(), env)
	expect(t, rs, "host north: cluster file", OK, "same file")
	expect(t, rs, "host north: clock", OK, "offset")
	expect(t, rs, "host north: port", Fail, "open TCP") // no prefill runner there
	serveCluster(t, net.JoinHostPort("127.0.0.3", strconv.Itoa(env.Config.API.Port)), supervisor.ClusterInfo{Host: "north", Digest: "other"})
	env2 := testCluster(t, "north", "")
	env2.Config.API.Port = env.Config.API.Port
	expect(t, Peers{}.Run(context.Background(), env2), "host south: identity", Fail, `is host "north"'s, not south's`)
}

func TestLocalIdentity(t *testing.T) {
	env := testCluster(t, "south", "")
	env.Config.API.Port = freePort(t)
	env.Config.API.Listen = "127.0.0.3"
	serveCluster(t, net.JoinHostPort("127.0.0.3", strconv.Itoa(env.Config.API.Port)), supervisor.ClusterInfo{Host: "north", Digest: env.Digest})
	rs := LocalPorts{}.Run(context.Background(), env)
	expect(t, rs, "this host: identity", Fail, `is host "north"'s, not south's`)
	if env.LocalRunning {
		t.Error("another host's supervisor was taken for this host's")
	}
}

func TestKV(t *testing.T) {
	env := testCluster(t, "south", "insecure = true")
	rs := KV{}.Run(context.Background(), env)
	expect(t, rs, "KV wire to north/", Fail, "does not answer on the KV wire")
	env = testCluster(t, "north", "insecure = true") // north's own prefill runner, supervisor not running
	expect(t, KV{}.Run(context.Background(), env), "KV wire to north/", Skip, "not running")
}

// TestStageLinks: host north runs stage 0 of a two-stage pipeline, south
// stage 1. From north, the link to south's stage port fails while nothing
// listens there, then is reachable with a latency, and the goodput is
// measured from south's supervisor probe (the supervisor's own handler).
func TestStageLinks(t *testing.T) {
	env := testCluster(t, "north", "")
	text := strings.Replace(string(mustRead(t, env.Config.Path)), `decode = { hosts = ["south"] }
prefill = { hosts = ["north"] }`, `decode = { hosts = ["north", "south"], shard = "pipeline", layers = [1, 1] }`, 1)
	os.WriteFile(env.Config.Path, []byte(text), 0o644)
	env, rs := Load(Options{Path: env.Config.Path, Host: "north", Timeout: 2 * time.Second})
	if env == nil {
		t.Fatalf("load: %+v", rs)
	}
	env.Config.API.Port = freePort(t)
	stageAddr := net.JoinHostPort("127.0.0.3", strconv.Itoa(env.Config.StageLinkPort(0)))
	rs = StageLinks{ProbeMiB: 4}.Run(context.Background(), env)
	if len(rs) != 1 {
		t.Fatalf("results %+v", rs)
	}
	expect(t, rs, "stage link tiny-decode-stage0 → south ("+stageAddr+")", Fail, "open TCP")
	l, err := net.Listen("tcp", stageAddr)
	if err != nil {
		t.Skipf("%s: %v", stageAddr, err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	rs = StageLinks{ProbeMiB: 4}.Run(context.Background(), env)
	expect(t, rs, "stage link tiny-decode-stage0", Warn, "goodput not measured")
	api := net.JoinHostPort("127.0.0.3", strconv.Itoa(env.Config.API.Port))
	pl, err := net.Listen("tcp", api)
	if err != nil {
		t.Skipf("%s: %v", api, err)
	}
	srv := &http.Server{Handler: supervisor.ProbeHandler()}
	go srv.Serve(pl)
	defer srv.Close()
	rs = StageLinks{ProbeMiB: 4}.Run(context.Background(), env)
	expect(t, rs, "stage link tiny-decode-stage0", OK, "goodput")
	if rs[0].Data["bytes"] != int64(4<<20) || rs[0].Data["latency_s"].(float64) <= 0 {
		t.Errorf("data %+v", rs[0].Data)
	}
	// The stage link port is one of north's ports.
	link := net.JoinHostPort("127.0.0.2", strconv.Itoa(env.Config.StageLinkPort(0)))
	found := false
	for _, p := range env.hostPorts("north") {
		found = found || (p.what == "model tiny decode stage link" && p.addr == link)
	}
	if !found {
		t.Errorf("north's ports %+v lack the stage link", env.hostPorts("north"))
	}
}

func mustRead(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestMemoryOfAStage: a pipeline stage counts its share of the weights (the
// placement's estimate), not the whole model's files.
func TestMemoryOfAStage(t *testing.T) {
	env := testCluster(t, "north", "")
	model := filepath.Join(t.TempDir(), "tiny")
	if err := testmodel.Write(model, testmodel.Spec{Arch: "llama", Layers: 4}); err != nil {
		t.Fatal(err)
	}
	text := strings.Replace(string(mustRead(t, env.Config.Path)), `decode = { hosts = ["south"] }
prefill = { hosts = ["north"] }`, `decode = { hosts = ["north", "south"], shard = "pipeline" }`, 1)
	text = regexp.MustCompile(`source = ".*"`).ReplaceAllString(text, fmt.Sprintf("source = %q", model))
	os.WriteFile(env.Config.Path, []byte(text), 0o644)
	env, rs := Load(Options{Path: env.Config.Path, Host: "north", Timeout: 2 * time.Second})
	if env == nil {
		t.Fatalf("load: %+v", rs)
	}
	st := env.Config.Stages("tiny", "decode")
	if len(st) != 2 || st[0].WeightBytes == 0 {
		t.Fatalf("stages %+v", st)
	}
	rs = Memory{Available: func(*Env) (uint64, string, error) { return 1 << 30, "test memory", nil }}.Run(context.Background(), env)
	expect(t, rs, "memory", OK, "(layers 0:2)")
	if got := rs[0].Data["weights_bytes"]; got != st[0].WeightBytes {
		t.Errorf("weights %v, want stage 0's %d", got, st[0].WeightBytes)
	}
}

// TestTensorLinks: a rank after 0 checks its link to rank 0's tensor port;
// rank 0's tensor port is among its host's ports.
func TestTensorLinks(t *testing.T) {
	env := testCluster(t, "south", "")
	text := strings.Replace(string(mustRead(t, env.Config.Path)), `decode = { hosts = ["south"] }
prefill = { hosts = ["north"] }`, `decode = { hosts = ["north", "south"], shard = "tensor" }`, 1)
	os.WriteFile(env.Config.Path, []byte(text), 0o644)
	env, rs := Load(Options{Path: env.Config.Path, Host: "south", Timeout: 2 * time.Second})
	if env == nil {
		t.Fatalf("load: %+v", rs)
	}
	addr := net.JoinHostPort("127.0.0.2", strconv.Itoa(env.Config.TensorLinkPort(0)))
	rs = StageLinks{}.Run(context.Background(), env)
	expect(t, rs, "tensor link tiny-decode-rank1 → north ("+addr+")", Fail, "its tensor runner is up")
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("%s: %v", addr, err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	expect(t, StageLinks{}.Run(context.Background(), env), "tensor link tiny-decode-rank1", OK, "connect latency")
	found := false
	for _, p := range env.hostPorts("north") {
		found = found || (p.what == "model tiny decode tensor link" && p.addr == addr)
	}
	if !found {
		t.Errorf("north's ports %+v lack rank 0's tensor link", env.hostPorts("north"))
	}
}

// TestTensorStageLinks: on a pipeline of tensor stages (decode.tensor),
// stage 1's rank 1 checks its link to its own stage's rank 0 (the third
// host), and stage 1's rank 0 the stage link to stage 0.
func TestTensorStageLinks(t *testing.T) {
	env := testCluster(t, "south", "")
	text := strings.Replace(string(mustRead(t, env.Config.Path)), `decode = { hosts = ["south"] }
prefill = { hosts = ["north"] }`, `decode = { hosts = ["north", "south", "east", "west"], shard = "pipeline", tensor = 2, layers = [1, 1] }`, 1)
	text = strings.Replace(text, "[[models]]", `[hosts.east]
address = "127.0.0.4"
backend = "cpu"

[hosts.west]
address = "127.0.0.5"
backend = "cpu"

[[models]]`, 1)
	os.WriteFile(env.Config.Path, []byte(text), 0o644)
	for host, want := range map[string]string{
		"west": "tensor link tiny-decode-stage1-rank1 → east (127.0.0.4:" + strconv.Itoa(env.Config.TensorLinkPort(0)) + ")",
		"east": "stage link tiny-decode-stage1-rank0 → north (127.0.0.2:" + strconv.Itoa(env.Config.StageLinkPort(0)) + ")",
	} {
		env, rs := Load(Options{Path: env.Config.Path, Host: host, Timeout: 2 * time.Second})
		if env == nil {
			t.Fatalf("load: %+v", rs)
		}
		rs = StageLinks{}.Run(context.Background(), env)
		if len(rs) != 1 || rs[0].Name != want {
			t.Errorf("host %s checks %+v, want %q", host, rs, want)
		}
	}
}

// TestStageLinksGroups: with decode.groups each stage checks the link to
// the next stage of its own group.
func TestStageLinksGroups(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "cluster.toml")
	text := fmt.Sprintf(`[cluster]
insecure = true
runner_port_base = %d
[hosts.a]
address = "127.0.0.2"
backend = "cpu"
[hosts.b]
address = "127.0.0.3"
backend = "cpu"
[hosts.c]
address = "127.0.0.4"
backend = "cpu"
[hosts.d]
address = "127.0.0.5"
backend = "cpu"
[[models]]
name = "tiny"
source = "/nonexistent"
decode = { groups = [["a", "b"], ["c", "d"]], shard = "pipeline", layers = [1, 1] }
`, freePort(t))
	os.WriteFile(path, []byte(text), 0o644)
	env, rs := Load(Options{Path: path, Host: "c", Timeout: 2 * time.Second})
	if env == nil {
		t.Fatalf("load: %+v", rs)
	}
	rs = StageLinks{ProbeMiB: 1}.Run(context.Background(), env)
	addr := net.JoinHostPort("127.0.0.5", strconv.Itoa(env.Config.StageLinkPort(0)))
	if len(rs) != 1 || !strings.HasPrefix(rs[0].Name, "stage link tiny-decode-group1-stage0 → d ("+addr+")") {
		t.Fatalf("results %+v, want group 1's stage 0 checking d", rs)
	}
}

// TestStageRing: a decode stage whose pipeline carries hidden states over
// MLX's ring probes the next stage's ring port: listening (the stages
// join) and refused (joined, or down: the host answers) are reachable; no
// answer is a failure naming the port to open. A pipeline with a cpu
// stage has no ring and no check.
func TestStageRing(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "cluster.toml")
	cluster := func(third, backend string) string {
		return fmt.Sprintf(`[cluster]
insecure = true
runner_port_base = %d
[hosts.a]
address = "127.0.0.2"
backend = "mlx-cpu"
[hosts.b]
address = "127.0.0.3"
backend = "metal"
[hosts.c]
address = %q
backend = %q
[[models]]
name = "tiny"
source = "/nonexistent"
decode = { hosts = ["a", "b", "c"], shard = "pipeline", layers = [1, 1, 1] }
`, freePort(t), third, backend)
	}
	load := func(src, host string) *Env {
		t.Helper()
		os.WriteFile(path, []byte(src), 0o644)
		env, rs := Load(Options{Path: path, Host: host, Timeout: 500 * time.Millisecond})
		if env == nil {
			t.Fatalf("load: %+v", rs)
		}
		return env
	}
	env := load(cluster("127.0.0.4", "mlx-cpu"), "a")
	ring := net.JoinHostPort("127.0.0.3", strconv.Itoa(env.Config.StageLinkPort(0)+1))
	name := "stage MLX ring tiny-decode-stage0 → b (" + ring + ")"
	rs := StageRing{}.Run(context.Background(), env)
	if len(rs) != 1 {
		t.Fatalf("results %+v", rs)
	}
	expect(t, rs, name, OK, "connection refused")
	// a's own ring port is among the ports its check covers.
	own := net.JoinHostPort("127.0.0.2", strconv.Itoa(env.Config.StageLinkPort(0)+1))
	if ps := env.hostPorts("a"); !slices.ContainsFunc(ps, func(p portUse) bool { return p.ring && p.addr == own }) {
		t.Errorf("a's ports %+v lack its MLX ring %s", ps, own)
	}
	l, err := net.Listen("tcp", ring)
	if err != nil {
		t.Skipf("%s: %v", ring, err)
	}
	rs = StageRing{}.Run(context.Background(), env)
	l.Close()
	expect(t, rs, name, OK, "listening")
	// Stage 1 probes stage 2's; an address that cannot be reached (here:
	// a name that does not resolve; a dropping firewall times out) fails.
	env = load(cluster("no-such-host.invalid", "mlx-cpu"), "b")
	expect(t, StageRing{}.Run(context.Background(), env), "stage MLX ring tiny-decode-stage1 → c (no-such-host.invalid:", Fail, "open TCP")
	env = load(cluster("127.0.0.4", "cpu"), "a")
	if rs := (StageRing{}).Run(context.Background(), env); len(rs) != 0 {
		t.Errorf("a pipeline with a cpu stage: %+v", rs)
	}
}

// TestSources: a model source this host cannot load is a failure before the
// supervisor starts runners that would crash-loop on it; an HF id not yet in
// the store is fine unless the cluster is offline or the store is not
// writable (the download has nowhere to go).
func TestSources(t *testing.T) {
	env := testCluster(t, "south", "")
	expect(t, Sources{}.Run(context.Background(), env), "model source tiny-decode", OK, env.Config.Runners("south")[0].Source)

	missing := filepath.Join(t.TempDir(), "no-such-model")
	for _, tt := range []struct {
		name, source, extra, status, want string
	}{
		{"missing path", missing, "", Fail, "does not exist"},
		{"not a gguf", mustWriteFile(t, "weights.bin"), "", Fail, "not a .gguf"},
		{"unknown builtin", "builtin:nope", "", Fail, "unknown builtin"},
		{"hf id to download", "org/model", "", OK, "downloaded on the runner's first start"},
		{"hf id offline", "org/model", "offline = true\n", Fail, "exo model pull org/model"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			env := testCluster(t, "south", tt.extra)
			rewriteSource(t, env, tt.source)
			expect(t, Sources{}.Run(context.Background(), env), "model source tiny-decode", tt.status, tt.want)
		})
	}
	if runtime.GOOS == "linux" {
		// A store nobody can create (procfs refuses new entries, even to root):
		// the download would fail after the runner started.
		t.Run("store not writable", func(t *testing.T) {
			env := testCluster(t, "south", "")
			text := regexp.MustCompile(`models_dir = ".*"`).ReplaceAllString(string(mustRead(t, env.Config.Path)), `models_dir = "/proc/exo-doctor-test/models"`)
			os.WriteFile(env.Config.Path, []byte(text), 0o644)
			rewriteSource(t, env, "org/model")
			expect(t, Sources{}.Run(context.Background(), env), "model source tiny-decode", Fail, "/proc/exo-doctor-test/models")
		})
	}
}

// rewriteSource points the test cluster's model at source and reloads env.
func rewriteSource(t *testing.T, env *Env, source string) {
	t.Helper()
	text := regexp.MustCompile(`source = ".*"`).ReplaceAllString(string(mustRead(t, env.Config.Path)), fmt.Sprintf("source = %q", source))
	os.WriteFile(env.Config.Path, []byte(text), 0o644)
	e, rs := Load(Options{Path: env.Config.Path, Host: env.Host, Timeout: 2 * time.Second})
	if e == nil {
		t.Fatalf("load: %+v", rs)
	}
	*env = *e
}

func mustWriteFile(t *testing.T, name string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}
