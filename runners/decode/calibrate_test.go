package decode

import (
	"context"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
)

// TestCalibrateHybrid: the router's start-up calibration of a prefill
// endpoint works for a model with recurrent layers (the tiny Qwen3-Next):
// it expects the same layer kinds as a real fetch, so the cost model is
// not left blind (routing by the floor) for hybrid models.
func TestCalibrateHybrid(t *testing.T) {
	ctx := context.Background()
	m := loadReference(t, "qwen3_next", engine.LoadOptions{})
	addr := servePrefill(t, m, 16, nil)
	r := loopbackRemote(m, addr)
	prompt := make([]int32, 65)
	for i := range prompt {
		prompt[i] = int32(3 + i%100)
	}
	st, err := r.Calibrate(ctx, addr, prompt)
	if err != nil {
		t.Fatalf("calibrate: %v", err)
	}
	if st.Bytes <= 0 || st.Duration <= 0 {
		t.Fatalf("calibration measured nothing: %+v", st)
	}
}
