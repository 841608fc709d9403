package weights

import (
	"testing"

	"github.com/exo-pd/exo-pd/runners/internal/testenv"
)

// BenchmarkGGUFToMLX measures the load-time conversion of GGUF blocks to
// MLX affine packing (bytes are GGUF input bytes).
func BenchmarkGGUFToMLX(b *testing.B) {
	const rows, cols = 1536, 576
	for _, c := range []struct {
		name       string
		typ        GGMLType
		blockBytes int
	}{{"Q4_0", TypeQ4_0, 18}, {"Q4_1", TypeQ4_1, 20}, {"Q8_0", TypeQ8_0, 34}} {
		b.Run(c.name, func(b *testing.B) {
			raw := make([]byte, rows*cols/32*c.blockBytes)
			for i := range raw {
				raw[i] = byte(i * 7)
			}
			b.SetBytes(int64(len(raw)))
			b.ReportAllocs()
			for b.Loop() {
				if _, _, _, err := ggufToMLX(c.typ, raw, rows, cols); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkOpenGGUFSmolLM2 measures mapping and parsing SmolLM2's GGUF
// (metadata incl. a 49152-token vocabulary and merges, tensor directory).
func BenchmarkOpenGGUFSmolLM2(b *testing.B) {
	path := testenv.SmolLM2(b)
	b.ReportAllocs()
	for b.Loop() {
		g, err := OpenGGUF(path)
		if err != nil {
			b.Fatal(err)
		}
		g.Close()
	}
}
