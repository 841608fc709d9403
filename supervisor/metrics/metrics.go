// Package metrics owns the supervisor's Prometheus endpoint: the
// supervisor's own metrics (exo_runner_up, exo_runner_restarts_total,
// exo_config_last_reload_successful, …), the metrics of this host's runners
// fetched from their /metrics and merged in with a runner label, and any
// extra collectors (the NVML GPU collector), each with its own scrape
// success and duration — so each host is one Prometheus target. It learns
// about runners through a function and must not import runners/.
package metrics

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/protobuf/proto"
)

// Runner is what the metrics need to know about one runner.
type Runner struct {
	Name, Role, Model string
	Up                bool
	CrashLoop         bool
	Restarts          int
	// LivenessKills counts restarts the supervisor forced because the
	// runner's /health went unanswered.
	LivenessKills int
	// LoadProgress is how far the runner is through getting its model
	// ready, 0..1: downloading is the first half, loading weights the
	// second (as its /health reports); 1 once it serves.
	LoadProgress float64
	MetricsURL   string // http://HOST:PORT/metrics; "" = not scraped
}

// Metrics is the supervisor's registry and /metrics handler.
type Metrics struct {
	reg      *prometheus.Registry
	runners  func() []Runner
	client   *http.Client
	reloadOK prometheus.Gauge
	reloadTS prometheus.Gauge
}

const (
	scrapeSuccessName  = "exo_scrape_collector_success"
	scrapeSuccessHelp  = "Whether a collector of the supervisor's /metrics succeeded (1) or failed (0)."
	scrapeDurationName = "exo_scrape_collector_duration_seconds"
	scrapeDurationHelp = "How long a collector of the supervisor's /metrics took."
)

// New returns the supervisor's metrics; runners lists this host's runners
// at scrape time.
func New(runners func() []Runner) *Metrics {
	m := &Metrics{
		reg:     prometheus.NewRegistry(),
		runners: runners,
		client:  &http.Client{Timeout: 5 * time.Second},
		reloadOK: prometheus.NewGauge(prometheus.GaugeOpts{Name: "exo_config_last_reload_successful",
			Help: "Whether the last cluster file (re)load succeeded."}),
		reloadTS: prometheus.NewGauge(prometheus.GaugeOpts{Name: "exo_config_last_reload_success_timestamp_seconds",
			Help: "When the cluster file was last loaded successfully."}),
	}
	m.reg.MustRegister(m.reloadOK, m.reloadTS, runnerCollector{m})
	return m
}

// Registry is where extra collectors go (use Register for scrape metrics).
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Register adds a named collector whose scrape success and duration are
// reported as exo_scrape_collector_{success,duration_seconds}{collector=name}.
// A collector that returns an error from Update counts as failed.
func (m *Metrics) Register(name string, c Collector) {
	m.reg.MustRegister(timed{name, c})
}

// Collector is a collector that can fail as a whole.
type Collector interface {
	Describe(chan<- *prometheus.Desc)
	Update(ch chan<- prometheus.Metric) error
}

var (
	descScrapeSuccess  = prometheus.NewDesc(scrapeSuccessName, scrapeSuccessHelp, []string{"collector"}, nil)
	descScrapeDuration = prometheus.NewDesc(scrapeDurationName, scrapeDurationHelp, []string{"collector"}, nil)
	descRunnerUp       = prometheus.NewDesc("exo_runner_up", "Whether the runner answers /health with 200.", []string{"runner", "role", "model"}, nil)
	descRunnerRestarts = prometheus.NewDesc("exo_runner_restarts_total", "Times the supervisor restarted the runner after it exited.", []string{"runner"}, nil)
	descRunnerKills    = prometheus.NewDesc("exo_runner_liveness_restarts_total", "Restarts the supervisor forced because the runner's /health went unanswered (also counted in exo_runner_restarts_total).", []string{"runner"}, nil)
	descRunnerLoop     = prometheus.NewDesc("exo_runner_crash_looping", "Whether the runner exits too often and is being restarted slowly.", []string{"runner"}, nil)
	descRunnerProgress = prometheus.NewDesc("exo_runner_model_load_progress_ratio", "How far the runner is through downloading (first half) and loading (second half) its model; 1 once it serves.", []string{"runner", "model"}, nil)
)

type timed struct {
	name string
	c    Collector
}

func (t timed) Describe(ch chan<- *prometheus.Desc) {
	ch <- descScrapeSuccess
	ch <- descScrapeDuration
	t.c.Describe(ch)
}

func (t timed) Collect(ch chan<- prometheus.Metric) {
	start := time.Now()
	err := t.c.Update(ch)
	ok := 1.0
	if err != nil {
		ok = 0
	}
	ch <- prometheus.MustNewConstMetric(descScrapeDuration, prometheus.GaugeValue, time.Since(start).Seconds(), t.name)
	ch <- prometheus.MustNewConstMetric(descScrapeSuccess, prometheus.GaugeValue, ok, t.name)
}

type runnerCollector struct{ m *Metrics }

func (r runnerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descRunnerUp
	ch <- descRunnerRestarts
	ch <- descRunnerKills
	ch <- descRunnerLoop
	ch <- descRunnerProgress
}

func (r runnerCollector) Collect(ch chan<- prometheus.Metric) {
	for _, ru := range r.m.runners() {
		up := 0.0
		if ru.Up {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(descRunnerUp, prometheus.GaugeValue, up, ru.Name, ru.Role, ru.Model)
		ch <- prometheus.MustNewConstMetric(descRunnerRestarts, prometheus.CounterValue, float64(ru.Restarts), ru.Name)
		ch <- prometheus.MustNewConstMetric(descRunnerKills, prometheus.CounterValue, float64(ru.LivenessKills), ru.Name)
		loop := 0.0
		if ru.CrashLoop {
			loop = 1
		}
		ch <- prometheus.MustNewConstMetric(descRunnerLoop, prometheus.GaugeValue, loop, ru.Name)
		progress := ru.LoadProgress
		if ru.Up {
			progress = 1
		}
		ch <- prometheus.MustNewConstMetric(descRunnerProgress, prometheus.GaugeValue, progress, ru.Name, ru.Model)
	}
}

// SetReload records the outcome of a (re)load of the cluster file.
func (m *Metrics) SetReload(ok bool, at time.Time) {
	if ok {
		m.reloadOK.Set(1)
		m.reloadTS.Set(float64(at.UnixNano()) / 1e9)
	} else {
		m.reloadOK.Set(0)
	}
}

// Handler serves the merged exposition.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(prometheus.Gatherers{m.reg, runnerGatherer{m}},
		promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

// Gather returns the merged metric families (for tests and `exo status`).
func (m *Metrics) Gather() ([]*dto.MetricFamily, error) {
	return prometheus.Gatherers{m.reg, runnerGatherer{m}}.Gather()
}

// runnerGatherer scrapes every runner's /metrics and labels what it finds
// with runner=NAME.
type runnerGatherer struct{ m *Metrics }

type scraped struct {
	name     string
	fams     map[string]*dto.MetricFamily
	err      error
	duration time.Duration
}

func (g runnerGatherer) Gather() ([]*dto.MetricFamily, error) {
	var rs []Runner
	for _, r := range g.m.runners() {
		if r.MetricsURL != "" {
			rs = append(rs, r)
		}
	}
	results := make([]scraped, len(rs))
	var wg sync.WaitGroup
	for i, r := range rs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			fams, err := g.m.scrape(r.MetricsURL)
			results[i] = scraped{r.Name, fams, err, time.Since(start)}
		}()
	}
	wg.Wait()
	merged := map[string]*dto.MetricFamily{}
	success := &dto.MetricFamily{Name: proto.String(scrapeSuccessName), Help: proto.String(scrapeSuccessHelp), Type: dto.MetricType_GAUGE.Enum()}
	duration := &dto.MetricFamily{Name: proto.String(scrapeDurationName), Help: proto.String(scrapeDurationHelp), Type: dto.MetricType_GAUGE.Enum()}
	for _, s := range results {
		collector := "runner:" + s.name
		ok := 1.0
		if s.err != nil {
			ok = 0
		}
		success.Metric = append(success.Metric, gauge(collector, ok))
		duration.Metric = append(duration.Metric, gauge(collector, s.duration.Seconds()))
		for name, f := range s.fams {
			for _, met := range f.Metric {
				if !hasLabel(met, "runner") {
					met.Label = append(met.Label, &dto.LabelPair{Name: proto.String("runner"), Value: proto.String(s.name)})
				}
			}
			if have, ok := merged[name]; ok && have.GetType() == f.GetType() {
				have.Metric = append(have.Metric, f.Metric...)
			} else if !ok {
				merged[name] = f
			}
		}
	}
	out := []*dto.MetricFamily{success, duration}
	names := make([]string, 0, len(merged))
	for n := range merged {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		out = append(out, merged[n])
	}
	if len(rs) == 0 {
		return nil, nil
	}
	return out, nil
}

func gauge(collector string, v float64) *dto.Metric {
	return &dto.Metric{
		Label: []*dto.LabelPair{{Name: proto.String("collector"), Value: proto.String(collector)}},
		Gauge: &dto.Gauge{Value: proto.Float64(v)},
	}
}

func hasLabel(m *dto.Metric, name string) bool {
	for _, l := range m.Label {
		if l.GetName() == name {
			return true
		}
	}
	return false
}

func (m *Metrics) scrape(url string) (map[string]*dto.MetricFamily, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := m.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape %s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	return fams, nil
}
