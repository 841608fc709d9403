package stage_test

import (
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/runners/engine"
	"github.com/exo-pd/exo-pd/runners/stage"
)

// linkModel is a 6-layer model of hidden size 32 to NewLinkConfig.
type linkModel struct{}

func (linkModel) Info() engine.ModelInfo          { return engine.ModelInfo{Layers: 6, Hidden: 32} }
func (linkModel) Fingerprint() engine.Fingerprint { return engine.Fingerprint{1, 2, 3} }

// TestNewLinkConfig: a stage's end of the stage links carries its place,
// its layers and the model's; layers past the model's end, and a last
// stage short of it, are refused naming --stage and --layers.
func TestNewLinkConfig(t *testing.T) {
	secret := []byte("s")
	for _, tc := range []struct {
		stage, stages int
		layers        engine.LayerRange
		bad           bool
	}{
		{0, 2, engine.LayerRange{Start: 0, End: 3}, false},
		{1, 2, engine.LayerRange{Start: 3, End: 6}, false},
		{1, 3, engine.LayerRange{Start: 2, End: 4}, false},
		{1, 2, engine.LayerRange{Start: 3, End: 5}, true}, // the last stage short of the end
		{0, 2, engine.LayerRange{Start: 0, End: 7}, true}, // past the end
		{2, 3, engine.LayerRange{Start: 4, End: 7}, true},
	} {
		lc, err := stage.NewLinkConfig(tc.stage, tc.stages, tc.layers, linkModel{}, secret)
		if tc.bad {
			if err == nil || !strings.Contains(err.Error(), "--stage") || !strings.Contains(err.Error(), "--layers") {
				t.Errorf("stage %d/%d layers %v: %v, want a refusal naming --stage and --layers", tc.stage, tc.stages, tc.layers, err)
			}
			continue
		}
		want := stage.LinkConfig{Stage: tc.stage, Stages: tc.stages, First: tc.layers.Start, End: tc.layers.End, Layers: 6, Hidden: 32,
			Fingerprint: engine.Fingerprint{1, 2, 3}, Secret: secret}
		if err != nil || lc.Stage != want.Stage || lc.Stages != want.Stages || lc.First != want.First || lc.End != want.End ||
			lc.Layers != want.Layers || lc.Hidden != want.Hidden || lc.Fingerprint != want.Fingerprint || string(lc.Secret) != "s" {
			t.Errorf("stage %d/%d layers %v: %+v, %v; want %+v", tc.stage, tc.stages, tc.layers, lc, err, want)
		}
	}
}
