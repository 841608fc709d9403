//go:build cgo && linux

package gpu

import (
	"errors"
	"fmt"
	"log/slog"
	"strconv"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus"
)

// Collector reads every GPU through an nvml.Interface.
type Collector struct {
	lib nvml.Interface
	log *slog.Logger
}

// Open loads NVML; without a driver it logs one line and returns nil.
func Open(log *slog.Logger) *Collector {
	c, err := New(nvml.New(), log)
	if err != nil {
		log.Info("GPU metrics off", "reason", err)
		return nil
	}
	return c
}

// New initialises lib and returns a collector over it.
func New(lib nvml.Interface, log *slog.Logger) (*Collector, error) {
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("nvml init: %s", errorString(lib, ret))
	}
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		lib.Shutdown()
		return nil, fmt.Errorf("nvml device count: %s", errorString(lib, ret))
	}
	log.Info("GPU metrics on", "gpus", n)
	return &Collector{lib: lib, log: log}, nil
}

func errorString(lib nvml.Interface, ret nvml.Return) (s string) {
	defer func() {
		if recover() != nil {
			s = fmt.Sprintf("nvml error %d", int(ret))
		}
	}()
	return lib.ErrorString(ret)
}

// Close shuts NVML down.
func (c *Collector) Close() { c.lib.Shutdown() }

// Describe implements metrics.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descUtil
	ch <- descMem
	ch <- descTemp
	ch <- descPower
}

// Update implements metrics.Collector: one sample of every supported field
// of every GPU. It fails only when the GPUs cannot be listed.
func (c *Collector) Update(ch chan<- prometheus.Metric) error {
	n, ret := c.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("nvml device count: %s", errorString(c.lib, ret))
	}
	var errs []error
	for i := range n {
		d, ret := c.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			errs = append(errs, fmt.Errorf("gpu %d: %s", i, errorString(c.lib, ret)))
			continue
		}
		gpu := strconv.Itoa(i)
		emit := func(desc *prometheus.Desc, v float64, ret nvml.Return) {
			switch ret {
			case nvml.SUCCESS:
				ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, v, gpu)
			case nvml.ERROR_NOT_SUPPORTED:
				// This GPU has no such field (e.g. GB10 memory): skip it.
			default:
				c.log.Debug("nvml field unavailable", "gpu", gpu, "metric", desc.String(), "err", errorString(c.lib, ret))
			}
		}
		u, ret := d.GetUtilizationRates()
		emit(descUtil, float64(u.Gpu)/100, ret)
		m, ret := d.GetMemoryInfo()
		emit(descMem, float64(m.Used), ret)
		t, ret := d.GetTemperature(nvml.TEMPERATURE_GPU)
		emit(descTemp, float64(t), ret)
		p, ret := d.GetPowerUsage()
		emit(descPower, float64(p)/1000, ret)
	}
	return errors.Join(errs...)
}

// System reads the driver's versions and lists the GPUs.
func (c *Collector) System() (System, error) {
	var s System
	v, ret := c.lib.SystemGetDriverVersion()
	if ret != nvml.SUCCESS {
		return s, fmt.Errorf("nvml driver version: %s", errorString(c.lib, ret))
	}
	s.Driver = v
	if s.CUDA, ret = c.lib.SystemGetCudaDriverVersion(); ret != nvml.SUCCESS {
		return s, fmt.Errorf("nvml CUDA driver version: %s", errorString(c.lib, ret))
	}
	n, ret := c.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return s, fmt.Errorf("nvml device count: %s", errorString(c.lib, ret))
	}
	for i := range n {
		d, ret := c.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return s, fmt.Errorf("gpu %d: %s", i, errorString(c.lib, ret))
		}
		dev := Device{Index: i}
		if dev.Name, ret = d.GetName(); ret != nvml.SUCCESS {
			dev.Name = "unknown"
		}
		if m, ret := d.GetMemoryInfo(); ret == nvml.SUCCESS {
			dev.MemoryTotal, dev.MemoryFree = m.Total, m.Free
		}
		s.Devices = append(s.Devices, dev)
	}
	return s, nil
}

// Samples reads every GPU once: the fields of Update, with each GPU's name
// and memory total. A GPU that cannot be read is left out; it fails only
// when the GPUs cannot be listed.
func (c *Collector) Samples() ([]Sample, error) {
	n, ret := c.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("nvml device count: %s", errorString(c.lib, ret))
	}
	out := []Sample{}
	for i := range n {
		d, ret := c.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			continue
		}
		s := Sample{Index: i}
		if name, ret := d.GetName(); ret == nvml.SUCCESS {
			s.Name = name
		}
		if u, ret := d.GetUtilizationRates(); ret == nvml.SUCCESS {
			v := float64(u.Gpu) / 100
			s.Utilization = &v
		}
		if m, ret := d.GetMemoryInfo(); ret == nvml.SUCCESS {
			used, total := m.Used, m.Total
			s.MemoryUsed, s.MemoryTotal = &used, &total
		}
		if t, ret := d.GetTemperature(nvml.TEMPERATURE_GPU); ret == nvml.SUCCESS {
			v := float64(t)
			s.TemperatureC = &v
		}
		if p, ret := d.GetPowerUsage(); ret == nvml.SUCCESS {
			v := float64(p) / 1000
			s.PowerW = &v
		}
		out = append(out, s)
	}
	return out, nil
}
