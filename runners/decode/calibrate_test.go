package decode

import (
	"context"
	"net"
	"path/filepath"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/engine/cpu"
	"github.com/exo-pd/exo-pd/runners/kvwire"
	"github.com/exo-pd/exo-pd/runners/metrics"
	"github.com/exo-pd/exo-pd/runners/prefill"
)

// TestCalibrateHybrid: the router's start-up calibration of a prefill
// endpoint works for a model with recurrent layers (the tiny Qwen3-Next):
// it expects the same layer kinds as a real fetch, so the cost model is
// not left blind (routing by the floor) for hybrid models.
func TestCalibrateHybrid(t *testing.T) {
	ctx := context.Background()
	m, err := engine.Load(ctx, filepath.Join("..", "engine", "testdata", "reference", "qwen3_next"), cpu.New(2), engine.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	prod := prefill.New(prefill.Options{Name: "m", Model: m, Chunk: 16, Metrics: metrics.New("prefill")})
	defer prod.Close()
	srv, err := kvwire.NewServer(kvwire.ServerConfig{Producer: prod})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go srv.Serve(sctx, l)
	r := &KVRemote{Client: kvwire.NewClient(kvwire.ClientConfig{}), Name: "m", Model: m,
		Selector: kvwire.NewSelector([]kvwire.Endpoint{{Addr: l.Addr().String(), Link: kvwire.LinkLoopback}})}
	prompt := make([]int32, 65)
	for i := range prompt {
		prompt[i] = int32(3 + i%100)
	}
	st, err := r.Calibrate(ctx, l.Addr().String(), prompt)
	if err != nil {
		t.Fatalf("calibrate: %v", err)
	}
	if st.Bytes <= 0 || st.Duration <= 0 {
		t.Fatalf("calibration measured nothing: %+v", st)
	}
}
