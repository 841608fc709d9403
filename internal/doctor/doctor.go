// Package doctor owns `exo doctor`'s checks: each is a Check (a name and
// Run(ctx, env) → results, each result a status, what was found and, when
// it is not ok, the one thing to do about it), testable alone over an Env
// the caller builds; Run loads the cluster file into an Env and runs them
// all in order. It reads the cluster file (supervisor/config) and asks
// other supervisors over HTTP and prefill runners over the KV wire, and on
// macOS runs read-only RDMA tools (rdma_ctl status, ibv_devices,
// ibv_devinfo); it changes nothing on the host and must not be imported by supervisor/ or
// runners/.
package doctor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/exo-pd/exo-pd/internal/hostmem"
	"github.com/exo-pd/exo-pd/internal/modelinfo"
	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/cpu"
	"github.com/exo-pd/exo-pd/runners/engine/mlx"
	"github.com/exo-pd/exo-pd/runners/hf"
	"github.com/exo-pd/exo-pd/runners/kvwire"
	"github.com/exo-pd/exo-pd/supervisor"
	"github.com/exo-pd/exo-pd/supervisor/config"
	"github.com/exo-pd/exo-pd/supervisor/gateway"
	"github.com/exo-pd/exo-pd/supervisor/gpu"
)

// A result's status.
const (
	OK   = "ok"
	Warn = "warn" // works, but worth a look
	Fail = "fail" // would break serving
	Skip = "skip" // not applicable here
)

// Result is one line of `exo doctor`: what was checked, what was found and,
// when it is not ok, the one thing to do about it.
type Result struct {
	Name   string         `json:"name"`
	Status string         `json:"status"`
	Detail string         `json:"detail,omitempty"`
	Fix    string         `json:"fix,omitempty"`
	Data   map[string]any `json:"data,omitempty"`
}

// Report is `exo doctor --json`.
type Report struct {
	Config string   `json:"config"`
	Host   string   `json:"host,omitempty"`
	OK     bool     `json:"ok"`
	Checks []Result `json:"checks"`
}

// Check is one of doctor's checks.
type Check interface {
	Name() string
	// Run checks and reports one or more results (none: not applicable,
	// nothing to say). A check may fill the Env for the checks after it
	// (Files: Secret and Key; LocalPorts: LocalRunning).
	Run(ctx context.Context, env *Env) []Result
}

// Env is what the checks share: the cluster file and this host.
type Env struct {
	Config *config.Config
	Digest string // supervisor.ClusterDigest of the file's bytes
	Host   string // this host's name in the file
	Secret []byte // the KV-wire secret (Files reads it)
	Key    []byte // the gateway's API key, when the file names one (Files reads it)
	// Timeout bounds each network check; Client is the HTTP client (nil:
	// one with Timeout).
	Timeout time.Duration
	Client  *http.Client
	// LocalRunning: this host's supervisor answers on its gateway
	// (LocalPorts finds out).
	LocalRunning bool
}

func (e *Env) client() *http.Client {
	if e.Client == nil {
		e.Client = &http.Client{Timeout: e.Timeout}
	}
	return e.Client
}

// Options configure Run.
type Options struct {
	Path     string // the cluster file
	Embedded bool   // check the embedded default instead of Path
	Host     string // this host's name ("": hostname, then address)
	Timeout  time.Duration
	ProbeMiB int    // KV-wire goodput probe per prefill link (0: none)
	MLX      string // auto, on or off
}

// Checks are doctor's checks in the order Run runs them.
func Checks(o Options) []Check {
	return []Check{Files{}, NVML{}, MLX{Mode: o.MLX}, Disk{}, Sources{}, Memory{}, LocalPorts{}, Peers{}, KV{ProbeMiB: o.ProbeMiB}, StageLinks{ProbeMiB: o.ProbeMiB}, StageRing{}, RDMA{}}
}

// Run loads the cluster file, identifies this host and runs every check.
func Run(ctx context.Context, o Options) *Report {
	rep := &Report{Config: o.Path}
	if o.Embedded {
		rep.Config = config.DefaultName
	}
	defer func() {
		rep.OK = !slices.ContainsFunc(rep.Checks, func(c Result) bool { return c.Status == Fail })
	}()
	env, rs := Load(o)
	rep.Checks = append(rep.Checks, rs...)
	if env == nil {
		return rep
	}
	rep.Host = env.Host
	for _, c := range Checks(o) {
		rep.Checks = append(rep.Checks, c.Run(ctx, env)...)
	}
	return rep
}

// Load reads and checks the cluster file and identifies this host; a nil
// Env when nothing else can be checked.
func Load(o Options) (*Env, []Result) {
	var data []byte
	path := o.Path
	if o.Embedded {
		data = []byte(config.DefaultText())
		path = config.DefaultName
	} else {
		var err error
		if data, err = os.ReadFile(path); err != nil {
			return nil, []Result{{Name: "cluster file", Status: Fail, Detail: err.Error(),
				Fix: fmt.Sprintf("write the cluster file to %s (annotated example: etc/exo/cluster.example.toml), or pass --config", path)}}
		}
	}
	c, err := config.Parse(path, data)
	if err != nil {
		return nil, []Result{{Name: "cluster file", Status: Fail, Detail: "invalid",
			Fix: "edit the file where each line says:\n" + err.Error()}}
	}
	env := &Env{Config: c, Digest: supervisor.ClusterDigest(data), Timeout: o.Timeout}
	rs := []Result{{Name: "cluster file", Status: OK,
		Detail: fmt.Sprintf("%s: cluster %q, %d hosts, %d models", path, c.Cluster.Name, len(c.Hosts), len(c.Models)),
		Data:   map[string]any{"config_sha256": env.Digest}}}
	if o.Embedded && o.Host == "" {
		env.Host = "local"
	} else {
		hn, _ := os.Hostname()
		if env.Host, err = c.Identify(o.Host, hn, config.LocalAddrs()); err != nil {
			return nil, append(rs, Result{Name: "this host", Status: Fail, Detail: err.Error(),
				Fix: fmt.Sprintf("pass --host NAME (one of %s), as `exo supervise --host` does", strings.Join(c.HostNames(), ", "))})
		}
	}
	// Pipelines are placed as the supervisor places them, so their stage
	// runners and links are known.
	mem, _ := hostmem.Reported()
	store, _ := modelinfo.StoreDir(c.Cluster.ModelsDir)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.Place(modelinfo.Local(ctx, store), env.Host, mem); err != nil {
		return nil, append(rs, Result{Name: "pipeline placement", Status: Fail, Detail: "does not fit or not supported",
			Fix: "edit the file where each line says:\n" + err.Error()})
	}
	h := c.Hosts[env.Host]
	return env, append(rs, Result{Name: "this host", Status: OK,
		Detail: fmt.Sprintf("%s (%s, backend %s), %d runners", env.Host, h.Address, h.Backend, len(c.Runners(env.Host)))})
}

// Files checks the secret and API key files and reads them into the Env.
type Files struct{}

func (Files) Name() string { return "files" }

func (Files) Run(_ context.Context, env *Env) []Result {
	var rs []Result
	cfg := env.Config
	if f := cfg.Cluster.SecretFile; f != "" {
		b, err := os.ReadFile(f)
		if err == nil && len(strings.TrimSpace(string(b))) == 0 {
			err = errors.New("the file is empty")
		}
		if err != nil {
			rs = append(rs, Result{Name: "secret file", Status: Fail, Detail: err.Error(),
				Fix: fmt.Sprintf("copy the cluster's secret to %s on this host (the same bytes on every host), readable by the user exo runs as", f)})
		} else {
			env.Secret = []byte(strings.TrimSpace(string(b)))
			rs = append(rs, Result{Name: "secret file", Status: OK, Detail: f})
		}
	} else if cfg.Cluster.Insecure {
		rs = append(rs, Result{Name: "secret file", Status: Warn, Detail: "insecure = true: the KV wire is unauthenticated",
			Fix: "set [cluster] secret_file (head -c 32 /dev/urandom | base64 > /etc/exo/secret, on every host) and drop insecure"})
	}
	if f := cfg.API.APIKeyFile; f != "" {
		k, err := gateway.ReadKeyFile(f)
		if err != nil {
			rs = append(rs, Result{Name: "api key file", Status: Fail, Detail: err.Error(),
				Fix: fmt.Sprintf("write the API key to %s (one line), readable by the user exo runs as", f)})
		} else {
			env.Key = k
			rs = append(rs, Result{Name: "api key file", Status: OK, Detail: f})
		}
	}
	return rs
}

// NVML checks that a cuda host has the NVIDIA driver, for CUDA 13.
type NVML struct {
	// System describes the driver and GPUs (nil: NVML through
	// supervisor/gpu); ok false when NVML cannot be loaded.
	System func() (sys gpu.System, ok bool, err error)
}

func (NVML) Name() string { return "nvidia driver" }

func nvmlSystem() (gpu.System, bool, error) {
	g := gpu.Open(slog.New(slog.DiscardHandler))
	if g == nil {
		return gpu.System{}, false, nil
	}
	defer g.Close()
	sys, err := g.System()
	return sys, true, err
}

func (n NVML) Run(_ context.Context, env *Env) []Result {
	if env.Config.Hosts[env.Host].Backend != config.CUDA {
		return nil
	}
	if n.System == nil {
		n.System = nvmlSystem
	}
	sys, ok, err := n.System()
	if !ok {
		return []Result{{Name: "nvidia driver", Status: Fail, Detail: "NVML cannot be loaded (no NVIDIA driver, or an exo built without cgo)",
			Fix: "install the NVIDIA driver (580 or newer, for CUDA 13; NixOS: hardware.nvidia with services.xserver.videoDrivers = [\"nvidia\"]) so that nvidia-smi works"}}
	}
	if err != nil {
		return []Result{{Name: "nvidia driver", Status: Fail, Detail: err.Error(), Fix: "check the driver with nvidia-smi"}}
	}
	var gpus []string
	for _, dev := range sys.Devices {
		s := dev.Name
		if dev.MemoryTotal > 0 {
			s += fmt.Sprintf(" (%.0f GiB, %.0f free)", float64(dev.MemoryTotal)/(1<<30), float64(dev.MemoryFree)/(1<<30))
		}
		gpus = append(gpus, s)
	}
	c := Result{Name: "nvidia driver", Status: OK,
		Detail: fmt.Sprintf("driver %s, CUDA %d.%d; %s", sys.Driver, sys.CUDA/1000, sys.CUDA%1000/10, strings.Join(gpus, ", ")),
		Data:   map[string]any{"driver": sys.Driver, "cuda": sys.CUDA, "devices": sys.Devices}}
	switch {
	case len(sys.Devices) == 0:
		c.Status, c.Fix = Fail, "the driver sees no GPU: check nvidia-smi and the device nodes (/dev/nvidia*)"
	case sys.CUDA < 13000:
		c.Status, c.Fix = Fail, "mlx-cuda-13 needs a driver for CUDA 13 (580 or newer): upgrade the NVIDIA driver"
	}
	return []Result{c}
}

// MLX loads libmlxc, reports its version and device, and compares a small
// matmul on MLX's device with the cpu backend.
type MLX struct {
	Mode string // auto (when the host's backend is cuda or metal), on, off
	// Open opens the backend on device and Describe describes it (nil:
	// runners/engine/mlx's New and Describe).
	Open     func(device string) (engine.Backend, error)
	Describe func(engine.Backend) (mlx.Info, bool)
}

func (MLX) Name() string { return "mlx" }

func (m MLX) Run(_ context.Context, env *Env) []Result {
	b := env.Config.Hosts[env.Host].Backend
	gpu := b == config.CUDA || b == config.Metal
	if m.Mode == "off" || m.Mode != "on" && !gpu {
		return []Result{{Name: "mlx", Status: Skip, Detail: fmt.Sprintf("backend %s does not use MLX (--mlx on checks it anyway)", b)}}
	}
	if m.Open == nil {
		m.Open = func(device string) (engine.Backend, error) { return mlx.New(mlx.Options{Device: device}) }
	}
	if m.Describe == nil {
		m.Describe = mlx.Describe
	}
	device := "gpu"
	if !gpu {
		device = "cpu"
	}
	be, err := m.Open(device)
	if err != nil {
		fix := "install the exo package that carries MLX (Nix: packages.exo), or set EXO_MLXC_PATH to libmlxc (README: Building MLX and mlx-c by hand)"
		if errors.Is(err, mlx.ErrDevice) {
			fix = "MLX loads but sees no GPU: on Linux install the NVIDIA driver for CUDA 13 (nvidia-smi must work) and use the mlx-cuda-13 build; on a Mac use the mlx-metal build"
		}
		return []Result{{Name: "mlx", Status: Fail, Detail: err.Error(), Fix: fix}}
	}
	if c, ok := be.(io.Closer); ok {
		defer c.Close()
	}
	info, _ := m.Describe(be)
	rs := []Result{{Name: "mlx", Status: OK, Detail: fmt.Sprintf("MLX %s on %s (%s)", info.Version, info.Device, info.Lib),
		Data: map[string]any{"version": info.Version, "device": info.Device, "lib": info.Lib}}}
	if info.QuantizedMatmul != nil {
		rs = append(rs, Result{Name: "mlx quantized matmul", Status: Warn, Detail: info.QuantizedMatmul.Error(),
			Fix: "quantized weights are dequantized once at load on this device (more memory); use an MLX build whose quantized_matmul runs here"})
	}
	diff, err := matmulAgainstCPU(be)
	switch {
	case err != nil:
		rs = append(rs, Result{Name: "mlx matmul", Status: Fail, Detail: err.Error(), Fix: "MLX fails a 64×64 matmul on this device: check the driver (nvidia-smi) and the MLX build"})
	case diff > 1e-3:
		rs = append(rs, Result{Name: "mlx matmul", Status: Fail, Detail: fmt.Sprintf("64×64 matmul differs from the cpu backend by %.3g (relative)", diff),
			Fix: "MLX computes wrong results on this device: update the driver or the MLX build"})
	default:
		rs = append(rs, Result{Name: "mlx matmul", Status: OK, Detail: fmt.Sprintf("64×64 f32 matmul on %s equals the cpu backend's (max relative difference %.2g)", info.Device, diff),
			Data: map[string]any{"max_rel_diff": diff}})
	}
	return rs
}

// matmulAgainstCPU computes one deterministic 64×64 product on be and on
// the pure-Go cpu backend and returns the largest difference relative to
// the largest magnitude.
func matmulAgainstCPU(be engine.Backend) (float64, error) {
	const n = 64
	x, y := make([]float32, n*n), make([]float32, n*n)
	for i := range x {
		x[i] = float32((i*7)%13-6) / 8
		y[i] = float32((i*5)%11-5) / 8
	}
	ref := cpu.New(1)
	want, err := ref.Float32(ref.MatMul(ref.FromFloat32(x, n, n), ref.FromFloat32(y, n, n)))
	if err != nil {
		return 0, fmt.Errorf("cpu backend: %w", err)
	}
	got, err := be.Float32(be.MatMul(be.FromFloat32(x, n, n), be.FromFloat32(y, n, n)))
	if err != nil {
		return 0, err
	}
	be.Free()
	var worst, scale float64
	for i := range want {
		worst = max(worst, math.Abs(float64(got[i]-want[i])))
		scale = max(scale, math.Abs(float64(want[i])))
	}
	return worst / max(scale, 1e-30), nil
}

// Memory compares the weights of the runners placed on this host (as
// far as they are on disk already) with the memory they will load into:
// the GPUs' free memory where NVML reports dedicated memory, else the
// system's (unified on a Mac or a GB10).
type Memory struct {
	// Available is the memory models load into and what it is (nil: the
	// GPUs' free memory on a cuda host, else the system's).
	Available func(env *Env) (uint64, string, error)
}

func (Memory) Name() string { return "memory" }

func (m Memory) Run(_ context.Context, env *Env) []Result {
	if m.Available == nil {
		m.Available = memoryFor
	}
	d := env
	var need int64
	var known, unknown []string
	for _, r := range d.Config.Runners(d.Host) {
		// A pipeline stage holds its share: the placement's estimate.
		if st := stageOf(d.Config, r); st != nil && st.WeightBytes > 0 {
			need += st.WeightBytes
			known = append(known, fmt.Sprintf("%s %.1f GiB (layers %d:%d)", r.Name, float64(st.WeightBytes)/(1<<30), st.Start, st.End))
			continue
		}
		path, err := hf.Resolve(context.Background(), r.Source, hf.Options{Offline: true, StoreDir: d.Config.Cluster.ModelsDir})
		if err != nil {
			unknown = append(unknown, r.Name)
			continue
		}
		n, err := weightBytes(path)
		if err != nil {
			unknown = append(unknown, r.Name)
			continue
		}
		need += n
		known = append(known, fmt.Sprintf("%s %.1f GiB", r.Name, float64(n)/(1<<30)))
	}
	if len(known) == 0 {
		if len(unknown) > 0 {
			return []Result{{Name: "memory", Status: Skip, Detail: "no weights on disk yet (" + strings.Join(unknown, ", ") + "): `exo model pull` them to check their size"}}
		}
		return nil
	}
	avail, what, err := m.Available(env)
	if err != nil {
		return []Result{{Name: "memory", Status: Warn, Detail: err.Error()}}
	}
	c := Result{Name: "memory", Status: OK,
		Detail: fmt.Sprintf("weights %.1f GiB (%s) of %.1f GiB %s", float64(need)/(1<<30), strings.Join(known, ", "), float64(avail)/(1<<30), what),
		Data:   map[string]any{"weights_bytes": need, "memory_bytes": avail}}
	if len(unknown) > 0 {
		c.Detail += "; not on disk yet: " + strings.Join(unknown, ", ")
	}
	// The KV cache and activations come on top of the weights.
	switch ratio := float64(need) / float64(avail); {
	case ratio > 0.9:
		c.Status, c.Fix = Fail, "the weights alone nearly fill the memory: place a model on another host, or use a quantized source (4-bit MLX, Q4 GGUF)"
	case ratio > 0.7:
		c.Status, c.Fix = Warn, "little room is left for the KV cache: expect short contexts or few concurrent requests, or move a model"
	}
	return []Result{c}
}

// stageOf is r's pipeline stage as placed, or nil.
func stageOf(c *config.Config, r config.Runner) *config.Stage {
	var i, n int
	if _, err := fmt.Sscanf(r.Stage, "%d/%d", &i, &n); err != nil {
		return nil
	}
	if st := c.RunnerStages(r); len(st) == n && i < n {
		return &st[i]
	}
	return nil
}

// memoryFor is the memory models load into on this host.
func memoryFor(d *Env) (uint64, string, error) {
	if d.Config.Hosts[d.Host].Backend == config.CUDA {
		if g := gpu.Open(slog.New(slog.DiscardHandler)); g != nil {
			defer g.Close()
			if sys, err := g.System(); err == nil {
				var free uint64
				for _, dev := range sys.Devices {
					free += dev.MemoryFree
				}
				if free > 0 {
					return free, "free GPU memory", nil
				}
			}
		}
	}
	return availableMemory()
}

// weightBytes is the size of a model's weight files: a .gguf file, or the
// .safetensors files of a directory.
func weightBytes(path string) (int64, error) {
	st, err := os.Stat(path)
	if err != nil {
		return 0, err
	}
	if !st.IsDir() {
		return st.Size(), nil
	}
	files, err := filepath.Glob(filepath.Join(path, "*.safetensors"))
	if err != nil || len(files) == 0 {
		return 0, fmt.Errorf("%s: no .safetensors files", path)
	}
	var n int64
	for _, f := range files {
		fi, err := os.Stat(f)
		if err != nil {
			return 0, err
		}
		n += fi.Size()
	}
	return n, nil
}

// Disk reports the free space of the model store.
type Disk struct{}

func (Disk) Name() string { return "model store disk" }

func (Disk) Run(_ context.Context, env *Env) []Result {
	dir := env.Config.Cluster.ModelsDir
	if dir == "" {
		var err error
		if dir, err = hf.StoreDir(hf.Options{}); err != nil {
			return []Result{{Name: "model store disk", Status: Warn, Detail: err.Error(), Fix: "set EXO_MODELS_DIR or [cluster] models_dir"}}
		}
	}
	probe := dir
	for {
		if _, err := os.Stat(probe); err == nil || probe == filepath.Dir(probe) {
			break
		}
		probe = filepath.Dir(probe)
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(probe, &st); err != nil {
		return []Result{{Name: "model store disk", Status: Warn, Detail: fmt.Sprintf("%s: %v", dir, err)}}
	}
	free := float64(st.Bavail) * float64(st.Bsize) / (1 << 30)
	c := Result{Name: "model store disk", Status: OK, Detail: fmt.Sprintf("%s: %.1f GiB free", dir, free), Data: map[string]any{"free_gib": free}}
	if free < 20 {
		c.Status, c.Fix = Warn, fmt.Sprintf("an 8B model in bf16 needs about 16 GiB: free space under %s or set [cluster] models_dir to a larger disk", dir)
	}
	return []Result{c}
}

// Sources checks that each runner placed on this host can find its model
// where it will start — and its draft model ([models.speculative] draft),
// which the decode runner loads at start too: a local directory or .gguf
// file that exists, builtin:smollm2 installed, an HF id already in the
// store or, when it is not, a cluster that may download and a store it can
// write to. Without it a wrong source shows only as a runner that
// crash-loops.
type Sources struct{}

func (Sources) Name() string { return "model source" }

func (Sources) Run(ctx context.Context, env *Env) []Result {
	var rs []Result
	for _, r := range env.Config.Runners(env.Host) {
		rs = append(rs, sourceResult(ctx, env, "model source "+r.Name, r.Source,
			fmt.Sprintf("fix the source of model %s in the cluster file", r.Model)))
		if r.Draft != "" {
			rs = append(rs, sourceResult(ctx, env, "draft source "+r.Name, r.Draft,
				fmt.Sprintf("fix [models.speculative] draft of model %s in the cluster file", r.Model)))
		}
	}
	return rs
}

// sourceResult is the check of one source named name; fix says where the
// source is set.
func sourceResult(ctx context.Context, env *Env, name, source, fix string) Result {
	path, err := hf.Resolve(ctx, source, hf.Options{Offline: true, StoreDir: env.Config.Cluster.ModelsDir})
	switch {
	case err == nil:
		return Result{Name: name, Status: OK, Detail: source + ": " + path}
	case errors.Is(err, hf.ErrNotInStore) && env.Config.Cluster.Offline:
		return Result{Name: name, Status: Fail, Detail: err.Error(),
			Fix: fmt.Sprintf("[cluster] offline = true forbids the download: run `exo model pull %s` on this host (or copy the store here)", source)}
	case errors.Is(err, hf.ErrNotInStore):
		if dir, werr := storeWritable(env.Config.Cluster.ModelsDir); werr != nil {
			return Result{Name: name, Status: Fail, Detail: fmt.Sprintf("%s is not in the store and the store cannot take it: %v", source, werr),
				Fix: fmt.Sprintf("make %s writable by the supervisor's user, or set [cluster] models_dir (or EXO_MODELS_DIR) to a writable disk", dir)}
		}
		return Result{Name: name, Status: OK, Detail: source + ": not in the store yet, downloaded on the runner's first start (`exo model pull` ahead of time avoids the wait)"}
	default:
		return Result{Name: name, Status: Fail, Detail: err.Error(),
			Fix: fix + " (a local directory or .gguf file present on this host, builtin:smollm2, or a Hugging Face id org/name[@rev])"}
	}
}

// storeWritable reports the model store directory and whether a download
// could create files there: the directory, or its nearest existing parent
// when it does not exist yet, takes a temporary file (removed at once;
// access(2) is no test for root).
func storeWritable(modelsDir string) (string, error) {
	dir, err := hf.StoreDir(hf.Options{StoreDir: modelsDir})
	if err != nil {
		return modelsDir, err
	}
	probe := dir
	for {
		if _, err := os.Stat(probe); err == nil || probe == filepath.Dir(probe) {
			break
		}
		probe = filepath.Dir(probe)
	}
	f, err := os.CreateTemp(probe, ".exo-doctor-*")
	if err != nil {
		return dir, err
	}
	f.Close()
	os.Remove(f.Name())
	return dir, nil
}

// hostPorts lists what host must serve: the gateway first, then every
// other port config.HostPorts gives it (its runners' ports, and MLX's ring
// ports, which no runner field names: the same list validate checks and
// the NixOS module's openFirewall opens), at the host's address.
func (d *Env) hostPorts(host string) []portUse {
	h := d.Config.Hosts[host]
	api := d.Config.API.Listen
	if api == "" || host != d.Host {
		api = h.Address
	}
	ps := []portUse{{"API gateway", net.JoinHostPort(api, strconv.Itoa(d.Config.API.Port)), d.Config.API.Listen == "", false}}
	for _, p := range d.Config.HostPorts(host) {
		if p.Port == d.Config.API.Port {
			continue // the gateway, above (validate gives each of a host's ports one claim)
		}
		ps = append(ps, portUse{p.What, net.JoinHostPort(h.Address, strconv.Itoa(p.Port)), false, p.Ring})
	}
	return ps
}

type portUse struct {
	what, addr string
	anyAddr    bool // the gateway binds all interfaces
	// ring: MLX's ring listens only while its group joins, so a running
	// supervisor's ring port is not dialled (only checked free when the
	// supervisor is not running).
	ring bool
}

// LocalPorts: with this host's supervisor running, every port must
// answer; without it, every port must be free to bind. It sets
// Env.LocalRunning. The supervisor answering on this host's gateway must
// be this host's (two supervisors on one machine: the first may hold the
// address of the other).
type LocalPorts struct{}

func (LocalPorts) Name() string { return "ports" }

func (LocalPorts) Run(ctx context.Context, d *Env) []Result {
	var rs []Result
	ports := d.hostPorts(d.Host)
	info, err := d.clusterInfo(ctx, ports[0].addr)
	running := err == nil
	if running && info.Host != "" && info.Host != d.Host {
		// Another host's supervisor holds this host's gateway: this host's
		// ports are checked as if its own supervisor were not running.
		rs = append(rs, identityFailure("this host", d.Host, ports[0].addr, info.Host))
		running = false
	}
	d.LocalRunning = running
	for _, p := range ports {
		name := "port " + p.addr + " (" + p.what + ")"
		_, port, _ := net.SplitHostPort(p.addr)
		if running && p.ring {
			rs = append(rs, Result{Name: name, Status: Skip, Detail: "not dialled: MLX's ring listens only while its group joins (`exo doctor` on a stopped host checks it is free; the stage MLX ring check probes a peer's)"})
			continue
		}
		if running {
			if err := d.dial(ctx, p.addr); err != nil {
				rs = append(rs, Result{Name: name, Status: Fail, Detail: "this host's supervisor runs but nothing answers: " + shortNetErr(err),
					Fix: "see `exo status` on this host for why the runner is not up (loading, crashing, port taken by another process)"})
			} else {
				rs = append(rs, Result{Name: name, Status: OK, Detail: "answering"})
			}
			continue
		}
		bind := p.addr
		if p.anyAddr {
			bind = ":" + port
		}
		l, err := net.Listen("tcp", bind)
		if err != nil {
			fix := fmt.Sprintf("port %s is taken: find the process with `ss -ltnp 'sport = :%s'` (macOS: `lsof -nP -iTCP:%s -sTCP:LISTEN`) and stop it, or give this runner another port in the cluster file", port, port, port)
			if errors.Is(err, syscall.EADDRNOTAVAIL) {
				fix = fmt.Sprintf("%s is not an address of this machine: fix this host's address in [hosts.%s] or run doctor with the right --host", p.addr, d.Host)
			}
			rs = append(rs, Result{Name: name, Status: Fail, Detail: "cannot listen: " + shortNetErr(err), Fix: fix})
			continue
		}
		l.Close()
		rs = append(rs, Result{Name: name, Status: OK, Detail: "free (the supervisor is not running here)"})
	}
	return rs
}

func (d *Env) dial(ctx context.Context, addr string) error {
	dl := net.Dialer{Timeout: d.Timeout}
	c, err := dl.DialContext(ctx, "tcp", addr)
	if err == nil {
		c.Close()
	}
	return err
}

// clusterInfo asks the supervisor whose gateway is at addr which file it runs.
func (d *Env) clusterInfo(ctx context.Context, addr string) (supervisor.ClusterInfo, error) {
	var info supervisor.ClusterInfo
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+supervisor.ClusterPath, nil)
	if err != nil {
		return info, err
	}
	if d.Key != nil {
		req.Header.Set("Authorization", "Bearer "+string(d.Key))
	}
	resp, err := d.client().Do(req)
	if err != nil {
		return info, err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if resp.StatusCode != http.StatusOK {
		return info, fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(body)))
	}
	return info, json.Unmarshal(body, &info)
}

// Peers asks every other host's supervisor for its name, cluster file
// digest and clock, and dials every port it should serve. An answer from
// a supervisor that names another host (two supervisors on one machine,
// the first bound to the other's address) is reported as such, not taken
// for the peer's.
type Peers struct{}

func (Peers) Name() string { return "peers" }

func (Peers) Run(ctx context.Context, d *Env) []Result {
	var rs []Result
	for _, hn := range d.Config.HostNames() {
		if hn == d.Host {
			continue
		}
		ports := d.hostPorts(hn)
		api := ports[0].addr
		t0 := time.Now()
		info, err := d.clusterInfo(ctx, api)
		rtt := time.Since(t0)
		if err != nil {
			c := Result{Name: "host " + hn, Status: Fail, Detail: "no supervisor answering at " + api + ": " + shortNetErr(err),
				Fix: fmt.Sprintf("start exo on %s (systemctl start exo), and open TCP %d there to this host (NixOS: services.exo.openFirewall = true; else a firewall rule)", hn, d.Config.API.Port)}
			if strings.Contains(err.Error(), "401") {
				c.Fix = "the API keys differ: put the same key in [api] api_key_file on every host"
			}
			rs = append(rs, c)
		} else if info.Host != "" && info.Host != hn {
			rs = append(rs, identityFailure("host "+hn, hn, api, info.Host))
		} else {
			if info.Digest != d.Digest {
				rs = append(rs, Result{Name: "host " + hn + ": cluster file", Status: Fail,
					Detail: fmt.Sprintf("%s runs a different cluster file (sha256 %.12s…, here %.12s…)", hn, info.Digest, d.Digest),
					Fix:    fmt.Sprintf("copy this host's %s to %s (or the other way round), then `systemctl reload exo` there", d.Config.Path, hn)})
			} else {
				rs = append(rs, Result{Name: "host " + hn + ": cluster file", Status: OK, Detail: "same file (sha256 " + d.Digest[:12] + "…)"})
			}
			// The peer read its clock somewhere within the round trip.
			skew := info.Time.Sub(t0.Add(rtt / 2))
			c := Result{Name: "host " + hn + ": clock", Status: OK,
				Detail: fmt.Sprintf("offset %v (±%v)", skew.Round(time.Millisecond), (rtt / 2).Round(time.Millisecond)),
				Data:   map[string]any{"offset_s": skew.Seconds()}}
			if skew.Abs()-rtt/2 > time.Second {
				c.Status, c.Fix = Fail, fmt.Sprintf("clocks differ by more than a second: enable NTP on both hosts (timedatectl set-ntp true; macOS: sntp -sS time.apple.com)")
			}
			rs = append(rs, c)
		}
		for _, p := range ports[1:] {
			name := fmt.Sprintf("host %s: port %s (%s)", hn, p.addr, p.what)
			if err := d.dial(ctx, p.addr); err != nil {
				_, port, _ := net.SplitHostPort(p.addr)
				rs = append(rs, Result{Name: name, Status: Fail, Detail: "unreachable: " + shortNetErr(err),
					Fix: fmt.Sprintf("open TCP %s on %s to this host (NixOS: services.exo.openFirewall = true), and check `exo status` on %s that the runner is up", port, hn, hn)})
			} else {
				rs = append(rs, Result{Name: name, Status: OK, Detail: "reachable"})
			}
		}
	}
	return rs
}

// KV proves the secret against every prefill runner (a one-token probe
// over the KV wire) and measures the goodput of the links this host's
// decode runners would use.
type KV struct {
	ProbeMiB int // goodput probe size (0: none)
}

func (KV) Name() string { return "kv wire" }

func (k KV) Run(ctx context.Context, d *Env) []Result {
	var rs []Result
	c := kvwire.NewClient(kvwire.ClientConfig{Secret: d.Secret, DialTimeout: d.Timeout, IdleTimeout: max(d.Timeout, 30*time.Second)})
	// Prefill endpoints this host's decode runners fetch from.
	mine := map[string]bool{}
	for _, r := range d.Config.Runners(d.Host) {
		for _, p := range r.Prefill {
			mine[p] = true
		}
	}
	seen := map[string]bool{}
	for _, hn := range d.Config.HostNames() {
		for _, r := range d.Config.Runners(hn) {
			if r.Role != config.Prefill || seen[r.Listen] {
				continue
			}
			seen[r.Listen] = true
			name := fmt.Sprintf("KV wire to %s/%s (%s)", hn, r.Name, r.Listen)
			if hn == d.Host && !d.LocalRunning {
				rs = append(rs, Result{Name: name, Status: Skip, Detail: "this host's supervisor is not running"})
				continue
			}
			pctx, cancel := context.WithTimeout(ctx, max(d.Timeout, 10*time.Second))
			_, err := c.Probe(pctx, r.Listen, 1)
			cancel()
			if err != nil {
				rs = append(rs, kvFailure(name, hn, d.Config.Cluster.SecretFile, err))
				continue
			}
			detail := "handshake ok"
			if d.Secret != nil {
				detail = "same secret (proved by the KV wire's challenge)"
			}
			if !mine[r.Listen] || k.ProbeMiB == 0 {
				rs = append(rs, Result{Name: name, Status: OK, Detail: detail})
				continue
			}
			tokens := int((int64(k.ProbeMiB)<<20 + kvwire.ProbeBytesPerToken - 1) / kvwire.ProbeBytesPerToken)
			pr, err := c.Probe(ctx, r.Listen, tokens)
			if err != nil {
				rs = append(rs, kvFailure(name, hn, d.Config.Cluster.SecretFile, err))
				continue
			}
			kind, iface := kvwire.DetectLink(r.Listen)
			gb := pr.Goodput() / 1e9
			rs = append(rs, Result{Name: name, Status: OK,
				Detail: fmt.Sprintf("%s; goodput %.3f GB/s over %s (%s), %d MiB in %v", detail, gb, kind, iface, pr.PayloadBytes>>20, pr.Transfer.Round(time.Millisecond)),
				Data:   map[string]any{"goodput_gbps": gb, "bytes": pr.PayloadBytes, "transfer_s": pr.Transfer.Seconds(), "link": kind.String(), "interface": iface}})
		}
	}
	return rs
}

// StageLinks checks each link this host's pipeline stages send on (to the
// next stage; the last stage's to stage 0) and its tensor-parallel ranks
// after 0 dial (to rank 0): that the far end's link port is reachable, its connect latency (median of a few TCP connects),
// and — ProbeMiB > 0 — the goodput of the path to that host, measured by
// fetching ProbeMiB from its supervisor's probe (same addresses, the
// gateway's port: the stage link carries no probe of its own).
type StageLinks struct {
	ProbeMiB int
}

func (StageLinks) Name() string { return "stage links" }

// stageConnects is how many TCP connects the latency is the median of.
const stageConnects = 5

func (k StageLinks) Run(ctx context.Context, d *Env) []Result {
	var rs []Result
	for _, r := range d.Config.Runners(d.Host) {
		target, next, kind := r.StageNext, "", "stage"
		var i, n int
		switch {
		case r.StageNext != "":
			if _, err := fmt.Sscanf(r.Stage, "%d/%d", &i, &n); err == nil && stageOf(d.Config, r) != nil {
				next = d.Config.RunnerStages(r)[(i+1)%n].Host
			}
		case r.Tensor != "" && !strings.HasPrefix(r.Tensor, "0/") && len(r.TensorPeers) > 0:
			// Ranks after 0 dial rank 0: the first decode host, or its
			// stage's first host for a rank of a tensor stage.
			target, kind = r.TensorPeers[0], "tensor"
			if m := d.Config.Model(r.Model); m != nil && m.Decode != nil && len(m.Decode.Hosts) > 0 {
				next = m.Decode.Hosts[0]
				if h, _, err := net.SplitHostPort(target); err == nil {
					for _, hn := range m.Decode.Hosts {
						if hh := d.Config.Hosts[hn]; hh != nil && hh.Address == h {
							next = hn
							break
						}
					}
				}
			}
		default:
			continue
		}
		name := fmt.Sprintf("%s link %s → %s (%s)", kind, r.Name, next, target)
		var rtts []time.Duration
		var err error
		for range stageConnects {
			t0 := time.Now()
			if err = d.dial(ctx, target); err != nil {
				break
			}
			rtts = append(rtts, time.Since(t0))
		}
		if err != nil {
			_, port, _ := net.SplitHostPort(target)
			rs = append(rs, Result{Name: name, Status: Fail, Detail: "unreachable: " + shortNetErr(err),
				Fix: fmt.Sprintf("open TCP %s on %s to this host (NixOS: services.exo.openFirewall = true), and check `exo status` on %s that its %s runner is up", port, next, next, kind)})
			continue
		}
		slices.Sort(rtts)
		lat := rtts[len(rtts)/2]
		c := Result{Name: name, Status: OK, Detail: fmt.Sprintf("reachable; connect latency %v (median of %d)", lat.Round(time.Microsecond), len(rtts)),
			Data: map[string]any{"latency_s": lat.Seconds()}}
		if k.ProbeMiB > 0 && next != "" {
			api := net.JoinHostPort(d.Config.Hosts[next].Address, strconv.Itoa(d.Config.API.Port))
			gb, n, dt, perr := d.probe(ctx, api, int64(k.ProbeMiB)<<20)
			if perr != nil {
				c.Status = Warn
				c.Detail += "; goodput not measured: " + perr.Error()
				c.Fix = fmt.Sprintf("the goodput probe asks %s's supervisor on %s: start it there (or pass --probe-mib 0)", next, api)
			} else {
				c.Detail += fmt.Sprintf("; goodput %.3f GB/s to %s, %d MiB in %v", gb, next, n>>20, dt.Round(time.Millisecond))
				c.Data["goodput_gbps"], c.Data["bytes"], c.Data["transfer_s"] = gb, n, dt.Seconds()
			}
		}
		rs = append(rs, c)
	}
	return rs
}

// StageRing checks, for each of this host's decode or prefill stages whose pipeline
// carries hidden states over MLX's ring (the supervisor writes the ring's
// hostfile: config.Runner.RingHostfile), the next stage's ring port (its
// stage link port + 1), beside the stage link check. MLX's ring listens
// only while the stages join, so a host that answers with a refusal is
// reachable (a pipeline that runs, or is down, refuses); a connect that
// times out or finds no route is a firewall or a wrong address, and the
// stages would wait in their join (then restart).
type StageRing struct{}

func (StageRing) Name() string { return "stage MLX ring" }

func (StageRing) Run(ctx context.Context, d *Env) []Result {
	var rs []Result
	for _, r := range d.Config.Runners(d.Host) {
		if r.RingHostfile == "" {
			continue
		}
		var ranks [][]string
		if err := json.Unmarshal([]byte(r.RingHostfile), &ranks); err != nil || len(ranks) < 2 || r.RingRank >= len(ranks) {
			rs = append(rs, Result{Name: "stage MLX ring " + r.Name, Status: Fail, Detail: fmt.Sprintf("the ring's hostfile %q: %v", r.RingHostfile, err)})
			continue
		}
		nextRank := (r.RingRank + 1) % len(ranks)
		target, next := ranks[nextRank][0], ""
		if st := d.Config.RunnerStages(r); len(st) == len(ranks) {
			next = st[nextRank].Host
		}
		name := fmt.Sprintf("stage MLX ring %s → %s (%s)", r.Name, next, target)
		err := d.dial(ctx, target)
		switch {
		case err == nil:
			rs = append(rs, Result{Name: name, Status: OK, Detail: "reachable; MLX's ring is listening (the stages are joining)",
				Data: map[string]any{"listening": true}})
		case errors.Is(err, syscall.ECONNREFUSED):
			rs = append(rs, Result{Name: name, Status: OK, Detail: "the host answers on it (connection refused: MLX's ring listens only while the stages join, so a joined or stopped pipeline refuses; a firewall that rejects looks the same)",
				Data: map[string]any{"listening": false}})
		default:
			_, port, _ := net.SplitHostPort(target)
			rs = append(rs, Result{Name: name, Status: Fail, Detail: "unreachable: " + shortNetErr(err),
				Fix: fmt.Sprintf("open TCP %s on %s to this host beside its stage link port (MLX's ring for the hidden states; NixOS: services.exo.openFirewall = true opens it), and check its address in the cluster file", port, next)})
		}
	}
	return rs
}

// probe fetches n bytes from the supervisor at api's goodput probe and
// returns GB/s, the bytes read and the time from the first byte on.
func (d *Env) probe(ctx context.Context, api string, n int64) (float64, int64, time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://%s%s?bytes=%d", api, supervisor.ProbePath, n), nil)
	if err != nil {
		return 0, 0, 0, err
	}
	if d.Key != nil {
		req.Header.Set("Authorization", "Bearer "+string(d.Key))
	}
	// The transfer may take longer than one network check.
	cl := &http.Client{Transport: d.client().Transport}
	pctx, cancel := context.WithTimeout(ctx, max(d.Timeout, 60*time.Second))
	defer cancel()
	resp, err := cl.Do(req.WithContext(pctx))
	if err != nil {
		return 0, 0, 0, errors.New(shortNetErr(err))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return 0, 0, 0, fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	var first [1]byte
	if _, err := io.ReadFull(resp.Body, first[:]); err != nil {
		return 0, 0, 0, err
	}
	t0 := time.Now()
	got, err := io.Copy(io.Discard, resp.Body)
	dt := time.Since(t0)
	if err != nil {
		return 0, 0, 0, err
	}
	got++
	if got != n {
		return 0, 0, 0, fmt.Errorf("probe answered %d of %d bytes", got, n)
	}
	return float64(got-1) / max(dt.Seconds(), 1e-9) / 1e9, got, dt, nil
}

func kvFailure(name, host, secretFile string, err error) Result {
	c := Result{Name: name, Status: Fail, Detail: err.Error()}
	switch {
	case errors.Is(err, kvwire.ErrAuth) && secretFile == "":
		c.Fix = fmt.Sprintf("%s's runners use a secret and this host has none: set the same [cluster] secret_file on every host", host)
	case errors.Is(err, kvwire.ErrAuth):
		c.Fix = fmt.Sprintf("the secrets differ: copy %s from %s to this host (same bytes everywhere), then `systemctl restart exo` on the host whose copy changed", secretFile, host)
	case errors.Is(err, kvwire.ErrMismatch):
		c.Fix = fmt.Sprintf("the prefill runner on %s predates the link probe: upgrade exo there", host)
	default:
		c.Fix = fmt.Sprintf("the prefill runner on %s does not answer on the KV wire: open its port to this host and check `exo status` there", host)
	}
	return c
}

// shortNetErr drops the "dial tcp …:" prefix Go puts on network errors.
func shortNetErr(err error) string {
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		return op.Err.Error()
	}
	return err.Error()
}

// Print writes the report as text: one line per result, then the fixes.
func Print(out io.Writer, rep *Report) {
	fmt.Fprintf(out, "exo doctor: %s", rep.Config)
	if rep.Host != "" {
		fmt.Fprintf(out, ", host %s", rep.Host)
	}
	fmt.Fprintln(out)
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	for _, c := range rep.Checks {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", strings.ToUpper(c.Status), c.Name, c.Detail)
	}
	tw.Flush()
	fixes := 0
	for _, c := range rep.Checks {
		if c.Fix != "" && c.Status != OK {
			if fixes == 0 {
				fmt.Fprintln(out, "\nTO FIX")
			}
			fixes++
			fmt.Fprintf(out, "- %s: %s\n", c.Name, c.Fix)
		}
	}
	if rep.OK {
		fmt.Fprintln(out, "\nok: nothing here would break serving")
	} else {
		fmt.Fprintln(out, "\nFAILED: fix the lines above")
	}
}

// identityFailure: the supervisor at addr, asked as host want's, names
// itself got.
func identityFailure(name, want, addr, got string) Result {
	return Result{Name: name + ": identity", Status: Fail,
		Detail: fmt.Sprintf("the supervisor answering at %s is host %q's, not %s's", addr, got, want),
		Fix: fmt.Sprintf("two supervisors share this address (on one machine, the first one's gateway binds every address: set [api] listen, or give each its own port): "+
			"stop the one of %q there or fix [hosts.%s] address so that it reaches %s's supervisor", got, want, want)}
}
