//go:build cgo && linux

package gpu

import (
	"bytes"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/prometheus/common/expfmt"

	"github.com/exo-pd/exo-pd/supervisor/metrics"
)

var update = flag.Bool("update", false, "rewrite golden files")

// fakeGPUs is an H100-like GPU 0 with every field and a GB10-like GPU 1 that
// has no dedicated memory (NOT_SUPPORTED) and a temperature read error.
func fakeGPUs() *mock.Interface {
	full := &mock.Device{
		GetNameFunc:             func() (string, nvml.Return) { return "NVIDIA H100", nvml.SUCCESS },
		GetUtilizationRatesFunc: func() (nvml.Utilization, nvml.Return) { return nvml.Utilization{Gpu: 87, Memory: 40}, nvml.SUCCESS },
		GetMemoryInfoFunc:       func() (nvml.Memory, nvml.Return) { return nvml.Memory{Total: 80 << 30, Used: 61 << 30}, nvml.SUCCESS },
		GetTemperatureFunc:      func(nvml.TemperatureSensors) (uint32, nvml.Return) { return 71, nvml.SUCCESS },
		GetPowerUsageFunc:       func() (uint32, nvml.Return) { return 312500, nvml.SUCCESS },
	}
	gb10 := &mock.Device{
		GetNameFunc:             func() (string, nvml.Return) { return "NVIDIA GB10", nvml.SUCCESS },
		GetUtilizationRatesFunc: func() (nvml.Utilization, nvml.Return) { return nvml.Utilization{Gpu: 5}, nvml.SUCCESS },
		GetMemoryInfoFunc:       func() (nvml.Memory, nvml.Return) { return nvml.Memory{}, nvml.ERROR_NOT_SUPPORTED },
		GetTemperatureFunc:      func(nvml.TemperatureSensors) (uint32, nvml.Return) { return 0, nvml.ERROR_UNKNOWN },
		GetPowerUsageFunc:       func() (uint32, nvml.Return) { return 24000, nvml.SUCCESS },
	}
	devs := []nvml.Device{full, gb10}
	return &mock.Interface{
		InitFunc:                   func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc:               func() nvml.Return { return nvml.SUCCESS },
		DeviceGetCountFunc:         func() (int, nvml.Return) { return len(devs), nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) { return devs[i], nvml.SUCCESS },
		ErrorStringFunc:            func(r nvml.Return) string { return "mock error" },
	}
}

func exposition(t *testing.T, m *metrics.Metrics) []byte {
	t.Helper()
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, f := range fams {
		if f.GetName() == "exo_scrape_collector_duration_seconds" {
			continue // varies from run to run
		}
		if err := enc.Encode(f); err != nil {
			t.Fatal(err)
		}
	}
	return buf.Bytes()
}

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		os.WriteFile(path, got, 0o644)
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("exposition differs from %s:\n%s", path, got)
	}
}

func TestCollectorExposition(t *testing.T) {
	c, err := New(fakeGPUs(), slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.New(func() []metrics.Runner { return nil })
	m.Register("gpu", c)
	golden(t, "gpu.prom", exposition(t, m))
}

func TestDeviceListFailureMarksScrapeFailed(t *testing.T) {
	lib := fakeGPUs()
	c, err := New(lib, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	lib.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_GPU_IS_LOST }
	m := metrics.New(func() []metrics.Runner { return nil })
	m.Register("gpu", c)
	golden(t, "gpu_lost.prom", exposition(t, m))
}

func TestNoDriver(t *testing.T) {
	lib := fakeGPUs()
	lib.InitFunc = func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }
	if _, err := New(lib, slog.Default()); err == nil {
		t.Fatal("New succeeded without a driver")
	}
	// The real library on this machine: no NVIDIA driver in CI → nil, no panic.
	if _, err := os.Stat("/dev/nvidiactl"); err != nil {
		if c := Open(slog.Default()); c != nil {
			t.Errorf("Open returned a collector without a driver")
		}
	}
}

func TestSystem(t *testing.T) {
	lib := fakeGPUs()
	lib.SystemGetDriverVersionFunc = func() (string, nvml.Return) { return "580.95.05", nvml.SUCCESS }
	lib.SystemGetCudaDriverVersionFunc = func() (int, nvml.Return) { return 13000, nvml.SUCCESS }
	names := []string{"NVIDIA H100 80GB HBM3", "NVIDIA GB10"}
	for i := range 2 {
		d, _ := lib.DeviceGetHandleByIndex(i)
		d.(*mock.Device).GetNameFunc = func() (string, nvml.Return) { return names[i], nvml.SUCCESS }
	}
	c, err := New(lib, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.System()
	if err != nil {
		t.Fatal(err)
	}
	want := System{Driver: "580.95.05", CUDA: 13000, Devices: []Device{
		{Index: 0, Name: "NVIDIA H100 80GB HBM3", MemoryTotal: 80 << 30},
		{Index: 1, Name: "NVIDIA GB10"},
	}}
	if fmt.Sprint(s) != fmt.Sprint(want) {
		t.Errorf("System() = %+v\nwant %+v", s, want)
	}
	lib.SystemGetCudaDriverVersionFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
	if _, err := c.System(); err == nil {
		t.Error("System succeeded without the CUDA version")
	}
}

// TestSamples: every field a GPU reports, none it does not (the GB10's
// memory, a temperature read error).
func TestSamples(t *testing.T) {
	lib := fakeGPUs()
	c, err := New(lib, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.Samples()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("%d samples", len(got))
	}
	h, g := got[0], got[1]
	if h.Utilization == nil || *h.Utilization != 0.87 || h.MemoryUsed == nil || *h.MemoryUsed != 61<<30 ||
		*h.MemoryTotal != 80<<30 || *h.TemperatureC != 71 || *h.PowerW != 312.5 {
		t.Errorf("gpu 0: %+v", h)
	}
	if h.Name != "NVIDIA H100" || g.Name != "NVIDIA GB10" {
		t.Errorf("names %q, %q", h.Name, g.Name)
	}
	if g.Index != 1 || g.MemoryUsed != nil || g.MemoryTotal != nil || g.TemperatureC != nil || *g.PowerW != 24 || *g.Utilization != 0.05 {
		t.Errorf("gpu 1: %+v", g)
	}
}
