// Package httpapi assembles a decode runner's HTTP surface: the OpenAI
// adapter (runners/openai) and the Anthropic adapter (runners/anthropic)
// over one gen.Generator, on one mux, each request counted in the
// runner's metrics by the served model name and HTTP status.
//
// It is the composition only: the adapters own their APIs, the generator
// (runners/decode) owns generation and knows neither. It must not import
// the engine, kvwire, runners/decode or anything under supervisor/.
package httpapi

import (
	"log/slog"
	"net/http"
	"strconv"

	"github.com/exo-pd/exo-pd/runners/anthropic"
	"github.com/exo-pd/exo-pd/runners/gen"
	"github.com/exo-pd/exo-pd/runners/metrics"
	"github.com/exo-pd/exo-pd/runners/openai"
)

// Options say what the adapters serve.
type Options struct {
	Gen gen.Generator
	// Name is the model name served, and the model label of the request
	// counts.
	Name string
	// Defaults are the model's sampling defaults (under request fields).
	Defaults gen.Defaults
	// AcceptTools: Gen honours tools, tool_choice and non-text
	// response_format; false refuses them with a 400 naming the field.
	AcceptTools bool
	// Metrics, when set, counts every generation request by status code.
	Metrics *metrics.Runner
	Logger  *slog.Logger
}

// Mount adds the OpenAI routes and Anthropic's /v1/messages to mux.
func Mount(mux *http.ServeMux, o Options) {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	var onResult func(string, int)
	if m := o.Metrics; m != nil {
		onResult = func(_ string, code int) {
			// Always the served name: a label from the request body would
			// let clients mint unbounded series.
			m.Requests.WithLabelValues(o.Name, strconv.Itoa(code)).Inc()
		}
	}
	served := []string{o.Name}
	(&openai.Handler{Gen: o.Gen, Served: served, Logger: o.Logger, Defaults: o.Defaults, AcceptTools: o.AcceptTools,
		OnResult: onResult}).Register(mux)
	(&anthropic.Handler{Gen: o.Gen, Served: served, Logger: o.Logger, Defaults: o.Defaults, AcceptTools: o.AcceptTools,
		OnResult: onResult}).Register(mux)
}
