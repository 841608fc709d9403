//go:build !(cgo && linux)

package gpu

import (
	"errors"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
)

// Collector is never created in builds without NVML support.
type Collector struct{}

// Open logs why there are no GPU metrics and returns nil.
func Open(log *slog.Logger) *Collector {
	log.Info("GPU metrics off", "reason", "this build has no NVML support (needs cgo on Linux)")
	return nil
}

// Close does nothing.
func (c *Collector) Close() {}

// Describe implements metrics.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {}

// Update implements metrics.Collector.
func (c *Collector) Update(ch chan<- prometheus.Metric) error {
	return errors.New("no NVML support in this build")
}

// System fails: this build cannot read NVML.
func (c *Collector) System() (System, error) {
	return System{}, errors.New("this build has no NVML support (needs cgo on Linux)")
}

// Samples fails: this build cannot read NVML.
func (c *Collector) Samples() ([]Sample, error) {
	return nil, errors.New("this build has no NVML support (needs cgo on Linux)")
}
