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
