// Package gpu owns the NVML GPU collector of the supervisor's /metrics:
// exo_gpu_utilization_ratio, exo_gpu_memory_used_bytes,
// exo_gpu_temperature_celsius and exo_gpu_power_watts, labelled gpu="<index>".
// NVML is loaded at run time through github.com/NVIDIA/go-nvml (which needs
// cgo): with no driver, or in a build without cgo, Open returns nil after one
// log line and the supervisor simply has no GPU metrics. A field a GPU does
// not support (the GB10 of the DGX Spark reports no dedicated memory) is
// skipped, not an error. It must not import runners/.
package gpu

import "github.com/prometheus/client_golang/prometheus"

var (
	descUtil  = prometheus.NewDesc("exo_gpu_utilization_ratio", "GPU busy time over the last sample period (0-1).", []string{"gpu"}, nil)
	descMem   = prometheus.NewDesc("exo_gpu_memory_used_bytes", "GPU memory in use.", []string{"gpu"}, nil)
	descTemp  = prometheus.NewDesc("exo_gpu_temperature_celsius", "GPU core temperature.", []string{"gpu"}, nil)
	descPower = prometheus.NewDesc("exo_gpu_power_watts", "GPU power draw.", []string{"gpu"}, nil)
)

// Device is one GPU as NVML describes it (for `exo doctor`).
type Device struct {
	Index int    `json:"index"`
	Name  string `json:"name"`
	// MemoryTotal and MemoryFree are 0 when the GPU has no dedicated memory
	// (NVML's NOT_SUPPORTED, e.g. the GB10's unified memory).
	MemoryTotal uint64 `json:"memory_total_bytes,omitempty"`
	MemoryFree  uint64 `json:"memory_free_bytes,omitempty"`
}

// System is the driver and its GPUs.
type System struct {
	Driver string `json:"driver"`
	// CUDA is the CUDA version the driver supports, as major*1000+minor*10
	// (13000 = 13.0).
	CUDA    int      `json:"cuda"`
	Devices []Device `json:"devices"`
}

// Sample is one GPU's current reading (for the dashboard). A field the GPU
// does not report is nil.
type Sample struct {
	Index        int      `json:"index"`
	Name         string   `json:"name,omitempty"`
	Utilization  *float64 `json:"utilization_ratio,omitempty"`
	MemoryUsed   *uint64  `json:"memory_used_bytes,omitempty"`
	MemoryTotal  *uint64  `json:"memory_total_bytes,omitempty"`
	TemperatureC *float64 `json:"temperature_celsius,omitempty"`
	PowerW       *float64 `json:"power_watts,omitempty"`
}
