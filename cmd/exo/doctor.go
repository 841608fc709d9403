package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
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

// A doctor check's outcome.
const (
	checkOK   = "ok"
	checkWarn = "warn" // works, but worth a look
	checkFail = "fail" // would break serving
	checkSkip = "skip" // not applicable here
)

// check is one line of `exo doctor`: what was checked, what was found and,
// when it is not ok, the one thing to do about it.
type check struct {
	Name   string         `json:"name"`
	Status string         `json:"status"`
	Detail string         `json:"detail,omitempty"`
	Fix    string         `json:"fix,omitempty"`
	Data   map[string]any `json:"data,omitempty"`
}

// doctorReport is `exo doctor --json`.
type doctorReport struct {
	Config string  `json:"config"`
	Host   string  `json:"host,omitempty"`
	OK     bool    `json:"ok"`
	Checks []check `json:"checks"`
}

func (r *doctorReport) add(c check) { r.Checks = append(r.Checks, c) }

// cmdDoctor checks that this host can serve its part of the cluster.
func cmdDoctor(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("doctor", flag.ContinueOnError)
	cfgPath := fs.String("config", config.DefaultPath, "the cluster file")
	embedded := fs.Bool("default", false, "check the embedded one-host default instead of a file")
	host := fs.String("host", "", "this host's name in the file (default: hostname, then address)")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	useMLX := fs.String("mlx", "auto", "check MLX: auto (when this host's backend is cuda or metal), on, off")
	probeMiB := fs.Int("probe-mib", 64, "KV-wire link probe size per prefill endpoint, MiB (0: no goodput probe)")
	timeout := fs.Duration("timeout", 5*time.Second, "bound of each network check")
	if err := parseFlags(fs, `usage: exo doctor [--config F | --default] [--host H] [--json] [--mlx auto|on|off] [--probe-mib N]

Checks that this host can serve its part of the cluster: the cluster file,
the secret and API key files, MLX (library, version, device, a matmul on the
GPU against the cpu backend), the model store's disk, this host's ports; and
across hosts, through the other supervisors: the same cluster file, clocks,
every runner port reachable, the same KV secret (proved with the KV wire's
challenge, never sent) and the goodput of each prefill link. Every problem
comes with its fix; exit status 1 when something would break serving.`, args); err != nil {
		return err
	}
	if *useMLX != "auto" && *useMLX != "on" && *useMLX != "off" {
		return exitError{2, fmt.Sprintf("--mlx %q: want auto, on or off", *useMLX)}
	}
	if *probeMiB < 0 || int64(*probeMiB)<<20 > kvwire.ProbeMaxTokens*kvwire.ProbeBytesPerToken {
		return exitError{2, fmt.Sprintf("--probe-mib %d: 0 to %d", *probeMiB, kvwire.ProbeMaxTokens*kvwire.ProbeBytesPerToken>>20)}
	}
	d := &doctor{timeout: *timeout, probeMiB: *probeMiB, mlxMode: *useMLX}
	rep := d.run(ctx, *cfgPath, *embedded, *host)
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else {
		printDoctor(os.Stdout, rep)
	}
	if !rep.OK {
		return exitError{1, ""}
	}
	return nil
}

type doctor struct {
	timeout  time.Duration
	probeMiB int
	mlxMode  string

	cfg    *config.Config
	digest string
	host   string
	secret []byte
	key    []byte // the gateway's API key, when the file names one
	client *http.Client
	// localRunning: this host's supervisor answers on its gateway.
	localRunning bool
}

func (d *doctor) run(ctx context.Context, path string, embedded bool, host string) *doctorReport {
	rep := &doctorReport{Config: path}
	if embedded {
		rep.Config = config.DefaultName
	}
	defer func() {
		rep.OK = !slices.ContainsFunc(rep.Checks, func(c check) bool { return c.Status == checkFail })
	}()
	d.client = &http.Client{Timeout: d.timeout}
	if !d.loadConfig(rep, path, embedded, host) {
		return rep
	}
	rep.Host = d.host
	d.checkFiles(rep)
	d.checkNVML(rep)
	d.checkMLX(rep)
	d.checkDisk(rep)
	d.checkMemory(rep)
	d.checkLocalPorts(ctx, rep)
	d.checkPeers(ctx, rep)
	d.checkKV(ctx, rep)
	return rep
}

// loadConfig reads, checks and identifies; false when nothing else can be checked.
func (d *doctor) loadConfig(rep *doctorReport, path string, embedded bool, host string) bool {
	var data []byte
	if embedded {
		data = []byte(config.DefaultText())
		path = config.DefaultName
	} else {
		var err error
		if data, err = os.ReadFile(path); err != nil {
			rep.add(check{Name: "cluster file", Status: checkFail, Detail: err.Error(),
				Fix: fmt.Sprintf("write the cluster file to %s (annotated example: etc/exo/cluster.example.toml), or pass --config", path)})
			return false
		}
	}
	c, err := config.Parse(path, data)
	if err != nil {
		rep.add(check{Name: "cluster file", Status: checkFail, Detail: "invalid",
			Fix: "edit the file where each line says:\n" + err.Error()})
		return false
	}
	d.cfg, d.digest = c, supervisor.ClusterDigest(data)
	rep.add(check{Name: "cluster file", Status: checkOK,
		Detail: fmt.Sprintf("%s: cluster %q, %d hosts, %d models", path, c.Cluster.Name, len(c.Hosts), len(c.Models)),
		Data:   map[string]any{"config_sha256": d.digest}})
	if embedded && host == "" {
		d.host = "local"
	} else {
		hn, _ := os.Hostname()
		if d.host, err = c.Identify(host, hn, config.LocalAddrs()); err != nil {
			rep.add(check{Name: "this host", Status: checkFail, Detail: err.Error(),
				Fix: fmt.Sprintf("pass --host NAME (one of %s), as `exo supervise --host` does", strings.Join(c.HostNames(), ", "))})
			return false
		}
	}
	h := c.Hosts[d.host]
	rep.add(check{Name: "this host", Status: checkOK,
		Detail: fmt.Sprintf("%s (%s, backend %s), %d runners", d.host, h.Address, h.Backend, len(c.Runners(d.host)))})
	return true
}

func (d *doctor) checkFiles(rep *doctorReport) {
	if f := d.cfg.Cluster.SecretFile; f != "" {
		b, err := os.ReadFile(f)
		if err == nil && len(strings.TrimSpace(string(b))) == 0 {
			err = errors.New("the file is empty")
		}
		if err != nil {
			rep.add(check{Name: "secret file", Status: checkFail, Detail: err.Error(),
				Fix: fmt.Sprintf("copy the cluster's secret to %s on this host (the same bytes on every host), readable by the user exo runs as", f)})
		} else {
			d.secret = []byte(strings.TrimSpace(string(b)))
			rep.add(check{Name: "secret file", Status: checkOK, Detail: f})
		}
	} else if d.cfg.Cluster.Insecure {
		rep.add(check{Name: "secret file", Status: checkWarn, Detail: "insecure = true: the KV wire is unauthenticated",
			Fix: "set [cluster] secret_file (head -c 32 /dev/urandom | base64 > /etc/exo/secret, on every host) and drop insecure"})
	}
	if f := d.cfg.API.APIKeyFile; f != "" {
		k, err := gateway.ReadKeyFile(f)
		if err != nil {
			rep.add(check{Name: "api key file", Status: checkFail, Detail: err.Error(),
				Fix: fmt.Sprintf("write the API key to %s (one line), readable by the user exo runs as", f)})
		} else {
			d.key = k
			rep.add(check{Name: "api key file", Status: checkOK, Detail: f})
		}
	}
}

// checkNVML: a cuda host needs the NVIDIA driver, for CUDA 13.
func (d *doctor) checkNVML(rep *doctorReport) {
	if d.cfg.Hosts[d.host].Backend != config.CUDA {
		return
	}
	g := gpu.Open(slog.New(slog.DiscardHandler))
	if g == nil {
		rep.add(check{Name: "nvidia driver", Status: checkFail, Detail: "NVML cannot be loaded (no NVIDIA driver, or an exo built without cgo)",
			Fix: "install the NVIDIA driver (580 or newer, for CUDA 13; NixOS: hardware.nvidia with services.xserver.videoDrivers = [\"nvidia\"]) so that nvidia-smi works"})
		return
	}
	defer g.Close()
	sys, err := g.System()
	if err != nil {
		rep.add(check{Name: "nvidia driver", Status: checkFail, Detail: err.Error(), Fix: "check the driver with nvidia-smi"})
		return
	}
	var gpus []string
	for _, dev := range sys.Devices {
		s := dev.Name
		if dev.MemoryTotal > 0 {
			s += fmt.Sprintf(" (%.0f GiB, %.0f free)", float64(dev.MemoryTotal)/(1<<30), float64(dev.MemoryFree)/(1<<30))
		}
		gpus = append(gpus, s)
	}
	c := check{Name: "nvidia driver", Status: checkOK,
		Detail: fmt.Sprintf("driver %s, CUDA %d.%d; %s", sys.Driver, sys.CUDA/1000, sys.CUDA%1000/10, strings.Join(gpus, ", ")),
		Data:   map[string]any{"driver": sys.Driver, "cuda": sys.CUDA, "devices": sys.Devices}}
	switch {
	case len(sys.Devices) == 0:
		c.Status, c.Fix = checkFail, "the driver sees no GPU: check nvidia-smi and the device nodes (/dev/nvidia*)"
	case sys.CUDA < 13000:
		c.Status, c.Fix = checkFail, "mlx-cuda-13 needs a driver for CUDA 13 (580 or newer): upgrade the NVIDIA driver"
	}
	rep.add(c)
}

// checkMLX loads libmlxc, reports its version and device, and compares a
// small matmul on MLX's device with the cpu backend.
func (d *doctor) checkMLX(rep *doctorReport) {
	b := d.cfg.Hosts[d.host].Backend
	gpu := b == config.CUDA || b == config.Metal
	if d.mlxMode == "off" || d.mlxMode == "auto" && !gpu {
		rep.add(check{Name: "mlx", Status: checkSkip, Detail: fmt.Sprintf("backend %s does not use MLX (--mlx on checks it anyway)", b)})
		return
	}
	device := "gpu"
	if !gpu {
		device = "cpu"
	}
	be, err := mlx.New(mlx.Options{Device: device})
	if err != nil {
		fix := "install the exo package that carries MLX (Nix: packages.exo), or set EXO_MLXC_PATH to libmlxc (README: Building MLX and mlx-c by hand)"
		if errors.Is(err, mlx.ErrDevice) {
			fix = "MLX loads but sees no GPU: on Linux install the NVIDIA driver for CUDA 13 (nvidia-smi must work) and use the mlx-cuda-13 build; on a Mac use the mlx-metal build"
		}
		rep.add(check{Name: "mlx", Status: checkFail, Detail: err.Error(), Fix: fix})
		return
	}
	if c, ok := be.(io.Closer); ok {
		defer c.Close()
	}
	info, _ := mlx.Describe(be)
	rep.add(check{Name: "mlx", Status: checkOK, Detail: fmt.Sprintf("MLX %s on %s (%s)", info.Version, info.Device, info.Lib),
		Data: map[string]any{"version": info.Version, "device": info.Device, "lib": info.Lib}})
	if info.QuantizedMatmul != nil {
		rep.add(check{Name: "mlx quantized matmul", Status: checkWarn, Detail: info.QuantizedMatmul.Error(),
			Fix: "quantized weights are dequantized once at load on this device (more memory); use an MLX build whose quantized_matmul runs here"})
	}
	diff, err := matmulAgainstCPU(be)
	switch {
	case err != nil:
		rep.add(check{Name: "mlx matmul", Status: checkFail, Detail: err.Error(), Fix: "MLX fails a 64×64 matmul on this device: check the driver (nvidia-smi) and the MLX build"})
	case diff > 1e-3:
		rep.add(check{Name: "mlx matmul", Status: checkFail, Detail: fmt.Sprintf("64×64 matmul differs from the cpu backend by %.3g (relative)", diff),
			Fix: "MLX computes wrong results on this device: update the driver or the MLX build"})
	default:
		rep.add(check{Name: "mlx matmul", Status: checkOK, Detail: fmt.Sprintf("64×64 f32 matmul on %s equals the cpu backend's (max relative difference %.2g)", info.Device, diff),
			Data: map[string]any{"max_rel_diff": diff}})
	}
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

// checkMemory compares the weights of the runners placed on this host (as
// far as they are on disk already) with the memory they will load into:
// the GPUs' free memory where NVML reports dedicated memory, else the
// system's (unified on a Mac or a GB10).
func (d *doctor) checkMemory(rep *doctorReport) {
	var need int64
	var known, unknown []string
	for _, r := range d.cfg.Runners(d.host) {
		path, err := hf.Resolve(context.Background(), r.Source, hf.Options{Offline: true, StoreDir: d.cfg.Cluster.ModelsDir})
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
			rep.add(check{Name: "memory", Status: checkSkip, Detail: "no weights on disk yet (" + strings.Join(unknown, ", ") + "): `exo model pull` them to check their size"})
		}
		return
	}
	avail, what, err := d.memoryFor()
	if err != nil {
		rep.add(check{Name: "memory", Status: checkWarn, Detail: err.Error()})
		return
	}
	c := check{Name: "memory", Status: checkOK,
		Detail: fmt.Sprintf("weights %.1f GiB (%s) of %.1f GiB %s", float64(need)/(1<<30), strings.Join(known, ", "), float64(avail)/(1<<30), what),
		Data:   map[string]any{"weights_bytes": need, "memory_bytes": avail}}
	if len(unknown) > 0 {
		c.Detail += "; not on disk yet: " + strings.Join(unknown, ", ")
	}
	// The KV cache and activations come on top of the weights.
	switch ratio := float64(need) / float64(avail); {
	case ratio > 0.9:
		c.Status, c.Fix = checkFail, "the weights alone nearly fill the memory: place a model on another host, or use a quantized source (4-bit MLX, Q4 GGUF)"
	case ratio > 0.7:
		c.Status, c.Fix = checkWarn, "little room is left for the KV cache: expect short contexts or few concurrent requests, or move a model"
	}
	rep.add(c)
}

// memoryFor is the memory models load into on this host.
func (d *doctor) memoryFor() (uint64, string, error) {
	if d.cfg.Hosts[d.host].Backend == config.CUDA {
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

// checkDisk reports the free space of the model store.
func (d *doctor) checkDisk(rep *doctorReport) {
	dir := d.cfg.Cluster.ModelsDir
	if dir == "" {
		var err error
		if dir, err = hf.StoreDir(hf.Options{}); err != nil {
			rep.add(check{Name: "model store disk", Status: checkWarn, Detail: err.Error(), Fix: "set EXO_MODELS_DIR or [cluster] models_dir"})
			return
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
		rep.add(check{Name: "model store disk", Status: checkWarn, Detail: fmt.Sprintf("%s: %v", dir, err)})
		return
	}
	free := float64(st.Bavail) * float64(st.Bsize) / (1 << 30)
	c := check{Name: "model store disk", Status: checkOK, Detail: fmt.Sprintf("%s: %.1f GiB free", dir, free), Data: map[string]any{"free_gib": free}}
	if free < 20 {
		c.Status, c.Fix = checkWarn, fmt.Sprintf("an 8B model in bf16 needs about 16 GiB: free space under %s or set [cluster] models_dir to a larger disk", dir)
	}
	rep.add(c)
}

// hostPorts lists what host must serve: the gateway and its runners' ports.
func (d *doctor) hostPorts(host string) []portUse {
	h := d.cfg.Hosts[host]
	api := d.cfg.API.Listen
	if api == "" || host != d.host {
		api = h.Address
	}
	ps := []portUse{{"API gateway", net.JoinHostPort(api, strconv.Itoa(d.cfg.API.Port)), d.cfg.API.Listen == ""}}
	for _, r := range d.cfg.Runners(host) {
		what := "decode HTTP"
		if r.Role == config.Prefill {
			what = "prefill KV"
		}
		ps = append(ps, portUse{r.Name + " " + what, r.Listen, false})
		if r.Metrics != "" {
			ps = append(ps, portUse{r.Name + " health/metrics", r.Metrics, false})
		}
	}
	return ps
}

type portUse struct {
	what, addr string
	anyAddr    bool // the gateway binds all interfaces
}

// checkLocalPorts: with this host's supervisor running, every port must
// answer; without it, every port must be free to bind.
func (d *doctor) checkLocalPorts(ctx context.Context, rep *doctorReport) {
	ports := d.hostPorts(d.host)
	_, err := d.clusterInfo(ctx, ports[0].addr)
	running := err == nil
	d.localRunning = running
	for _, p := range ports {
		name := "port " + p.addr + " (" + p.what + ")"
		_, port, _ := net.SplitHostPort(p.addr)
		if running {
			if err := d.dial(ctx, p.addr); err != nil {
				rep.add(check{Name: name, Status: checkFail, Detail: "this host's supervisor runs but nothing answers: " + shortNetErr(err),
					Fix: "see `exo status` on this host for why the runner is not up (loading, crashing, port taken by another process)"})
			} else {
				rep.add(check{Name: name, Status: checkOK, Detail: "answering"})
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
				fix = fmt.Sprintf("%s is not an address of this machine: fix this host's address in [hosts.%s] or run doctor with the right --host", p.addr, d.host)
			}
			rep.add(check{Name: name, Status: checkFail, Detail: "cannot listen: " + shortNetErr(err), Fix: fix})
			continue
		}
		l.Close()
		rep.add(check{Name: name, Status: checkOK, Detail: "free (the supervisor is not running here)"})
	}
}

func (d *doctor) dial(ctx context.Context, addr string) error {
	dl := net.Dialer{Timeout: d.timeout}
	c, err := dl.DialContext(ctx, "tcp", addr)
	if err == nil {
		c.Close()
	}
	return err
}

// clusterInfo asks the supervisor whose gateway is at addr which file it runs.
func (d *doctor) clusterInfo(ctx context.Context, addr string) (supervisor.ClusterInfo, error) {
	var info supervisor.ClusterInfo
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+supervisor.ClusterPath, nil)
	if err != nil {
		return info, err
	}
	if d.key != nil {
		req.Header.Set("Authorization", "Bearer "+string(d.key))
	}
	resp, err := d.client.Do(req)
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

// checkPeers asks every other host's supervisor for its cluster file digest
// and clock, and dials every port it should serve.
func (d *doctor) checkPeers(ctx context.Context, rep *doctorReport) {
	for _, hn := range d.cfg.HostNames() {
		if hn == d.host {
			continue
		}
		ports := d.hostPorts(hn)
		api := ports[0].addr
		t0 := time.Now()
		info, err := d.clusterInfo(ctx, api)
		rtt := time.Since(t0)
		if err != nil {
			c := check{Name: "host " + hn, Status: checkFail, Detail: "no supervisor answering at " + api + ": " + shortNetErr(err),
				Fix: fmt.Sprintf("start exo on %s (systemctl start exo), and open TCP %d there to this host (NixOS: services.exo.openFirewall = true; else a firewall rule)", hn, d.cfg.API.Port)}
			if strings.Contains(err.Error(), "401") {
				c.Fix = "the API keys differ: put the same key in [api] api_key_file on every host"
			}
			rep.add(c)
		} else {
			if info.Digest != d.digest {
				rep.add(check{Name: "host " + hn + ": cluster file", Status: checkFail,
					Detail: fmt.Sprintf("%s runs a different cluster file (sha256 %.12s…, here %.12s…)", hn, info.Digest, d.digest),
					Fix:    fmt.Sprintf("copy this host's %s to %s (or the other way round), then `systemctl reload exo` there", d.cfg.Path, hn)})
			} else {
				rep.add(check{Name: "host " + hn + ": cluster file", Status: checkOK, Detail: "same file (sha256 " + d.digest[:12] + "…)"})
			}
			// The peer read its clock somewhere within the round trip.
			skew := info.Time.Sub(t0.Add(rtt / 2))
			c := check{Name: "host " + hn + ": clock", Status: checkOK,
				Detail: fmt.Sprintf("offset %v (±%v)", skew.Round(time.Millisecond), (rtt / 2).Round(time.Millisecond)),
				Data:   map[string]any{"offset_s": skew.Seconds()}}
			if skew.Abs()-rtt/2 > time.Second {
				c.Status, c.Fix = checkFail, fmt.Sprintf("clocks differ by more than a second: enable NTP on both hosts (timedatectl set-ntp true; macOS: sntp -sS time.apple.com)")
			}
			rep.add(c)
		}
		for _, p := range ports[1:] {
			name := fmt.Sprintf("host %s: port %s (%s)", hn, p.addr, p.what)
			if err := d.dial(ctx, p.addr); err != nil {
				_, port, _ := net.SplitHostPort(p.addr)
				rep.add(check{Name: name, Status: checkFail, Detail: "unreachable: " + shortNetErr(err),
					Fix: fmt.Sprintf("open TCP %s on %s to this host (NixOS: services.exo.openFirewall = true), and check `exo status` on %s that the runner is up", port, hn, hn)})
			} else {
				rep.add(check{Name: name, Status: checkOK, Detail: "reachable"})
			}
		}
	}
}

// checkKV proves the secret against every prefill runner (a one-token
// probe over the KV wire) and measures the goodput of the links this
// host's decode runners would use.
func (d *doctor) checkKV(ctx context.Context, rep *doctorReport) {
	c := kvwire.NewClient(kvwire.ClientConfig{Secret: d.secret, DialTimeout: d.timeout, IdleTimeout: max(d.timeout, 30*time.Second)})
	// Prefill endpoints this host's decode runners fetch from.
	mine := map[string]bool{}
	for _, r := range d.cfg.Runners(d.host) {
		for _, p := range r.Prefill {
			mine[p] = true
		}
	}
	seen := map[string]bool{}
	for _, hn := range d.cfg.HostNames() {
		for _, r := range d.cfg.Runners(hn) {
			if r.Role != config.Prefill || seen[r.Listen] {
				continue
			}
			seen[r.Listen] = true
			name := fmt.Sprintf("KV wire to %s/%s (%s)", hn, r.Name, r.Listen)
			if hn == d.host && !d.localRunning {
				rep.add(check{Name: name, Status: checkSkip, Detail: "this host's supervisor is not running"})
				continue
			}
			pctx, cancel := context.WithTimeout(ctx, max(d.timeout, 10*time.Second))
			_, err := c.Probe(pctx, r.Listen, 1)
			cancel()
			if err != nil {
				rep.add(kvFailure(name, hn, d.cfg.Cluster.SecretFile, err))
				continue
			}
			detail := "handshake ok"
			if d.secret != nil {
				detail = "same secret (proved by the KV wire's challenge)"
			}
			if !mine[r.Listen] || d.probeMiB == 0 {
				rep.add(check{Name: name, Status: checkOK, Detail: detail})
				continue
			}
			tokens := int((int64(d.probeMiB)<<20 + kvwire.ProbeBytesPerToken - 1) / kvwire.ProbeBytesPerToken)
			pr, err := c.Probe(ctx, r.Listen, tokens)
			if err != nil {
				rep.add(kvFailure(name, hn, d.cfg.Cluster.SecretFile, err))
				continue
			}
			kind, iface := kvwire.DetectLink(r.Listen)
			gb := pr.Goodput() / 1e9
			rep.add(check{Name: name, Status: checkOK,
				Detail: fmt.Sprintf("%s; goodput %.3f GB/s over %s (%s), %d MiB in %v", detail, gb, kind, iface, pr.PayloadBytes>>20, pr.Transfer.Round(time.Millisecond)),
				Data:   map[string]any{"goodput_gbps": gb, "bytes": pr.PayloadBytes, "transfer_s": pr.Transfer.Seconds(), "link": kind.String(), "interface": iface}})
		}
	}
}

func kvFailure(name, host, secretFile string, err error) check {
	c := check{Name: name, Status: checkFail, Detail: err.Error()}
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

func printDoctor(out io.Writer, rep *doctorReport) {
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
		if c.Fix != "" && c.Status != checkOK {
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
