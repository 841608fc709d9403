package kvwire

import (
	"bufio"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/exo-pd/exo-pd/runners/internal/half"
)

// TestE4M3Reference compares the codec with ml_dtypes' float8_e4m3fn
// (testdata/e4m3_ref.txt, written by scripts/fp8/e4m3_fixture.py): every
// byte widened, and ~4,400 float32 values (edge cases, random, exact ties)
// encoded. Where the reference overflows to NaN from a non-NaN input, we
// saturate to ±448 by design.
func TestE4M3Reference(t *testing.T) {
	f, err := os.Open("testdata/e4m3_ref.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	var enc, dec, sat int
	for sc.Scan() {
		line := sc.Text()
		var a, b uint32
		switch {
		case len(line) > 4 && line[:4] == "enc ":
			if _, err := fmt.Sscanf(line, "enc %x %x", &a, &b); err != nil {
				t.Fatal(err)
			}
			in := math.Float32frombits(a)
			got, want := F32ToE4M3(in), uint8(b)
			if want&0x7f == 0x7f && in == in { // reference overflow → NaN
				want = uint8(a>>31)<<7 | 0x7e
				sat++
			}
			if got != want {
				t.Errorf("encode %g (%08x) = %02x, reference %02x", in, a, got, want)
			}
			enc++
		case len(line) > 4 && line[:4] == "dec ":
			if _, err := fmt.Sscanf(line, "dec %x %x", &a, &b); err != nil {
				t.Fatal(err)
			}
			got, want := E4M3ToF32(uint8(a)), math.Float32frombits(b)
			if got != want && !(got != got && want != want) || math.Signbit(float64(got)) != math.Signbit(float64(want)) {
				t.Errorf("decode %02x = %g, reference %g", a, got, want)
			}
			dec++
		}
	}
	if enc < 4000 || dec != 256 || sat < 4 {
		t.Fatalf("fixture had %d encodes, %d decodes, %d saturations", enc, dec, sat)
	}
}

func TestE4M3Table(t *testing.T) {
	for _, c := range []struct {
		in   float32
		want uint8
	}{
		{0, 0x00},
		{float32(math.Copysign(0, -1)), 0x80},
		{1, 0x38},
		{-1, 0xb8},
		{448, 0x7e},
		{-448, 0xfe},
		{464, 0x7e},                  // tie between 448 and (NaN slot 480): to even, 448
		{1e6, 0x7e},                  // saturates
		{float32(math.Inf(1)), 0x7e}, // saturates
		{float32(math.Inf(-1)), 0xfe},
		{0x1p-6, 0x08},         // smallest normal
		{0x1p-9, 0x01},         // smallest subnormal
		{0x1p-10, 0x00},        // tie 0 / 2^-9 → even 0
		{3 * 0x1p-10, 0x02},    // tie 1 / 2 subnormal steps → even 2
		{0x1p-10 * 1.01, 0x01}, // just above the tie
		{1.0625, 0x38},         // tie 1 / 1.125 → even 1
		{1.1875, 0x3a},         // tie 1.125 / 1.25 → even 1.25
		{7.6 * 0x1p-9, 0x08},   // rounds up out of the subnormals
	} {
		if got := F32ToE4M3(c.in); got != c.want {
			t.Errorf("F32ToE4M3(%g) = %#02x, want %#02x", c.in, got, c.want)
		}
	}
	for _, nan := range []float32{float32(math.NaN()), -float32(math.NaN())} {
		if q := F32ToE4M3(nan); q&0x7f != 0x7f {
			t.Errorf("NaN encoded as %#02x", q)
		}
	}
	if v := E4M3ToF32(0x7f); v == v {
		t.Error("0x7f is not NaN")
	}
	// Every finite byte round-trips.
	for q := range 256 {
		if q&0x7f == 0x7f {
			continue
		}
		if got := F32ToE4M3(E4M3ToF32(uint8(q))); got != uint8(q) {
			t.Errorf("byte %#02x round-trips to %#02x", q, got)
		}
	}
}

// TestFP8Section: per-head scales, widening into each cache dtype, relative
// error bounded by E4M3's half-ulp (2^-4) of each head's range, and the size
// about half of bf16's.
func TestFP8Section(t *testing.T) {
	const heads, tok, hd = 4, 33, 64
	n := heads * tok * hd
	r := rand.New(rand.NewPCG(1, 2))
	src := make([]byte, 4*n)
	vals := make([]float32, n)
	for i := range vals {
		h := i / (tok * hd)
		vals[i] = float32(r.NormFloat64()) * float32(math.Pow(10, float64(h-2))) // heads span 1e-2 … 10
		le.PutUint32(src[4*i:], math.Float32bits(vals[i]))
	}
	sec := make([]byte, FP8Len(heads, n))
	if err := EncodeFP8(sec, src, DTypeF32, heads); err != nil {
		t.Fatal(err)
	}
	if bf := 2 * n; float64(len(sec)) > 0.51*float64(bf) {
		t.Fatalf("fp8 section %d bytes vs bf16 %d", len(sec), bf)
	}
	for _, to := range []DType{DTypeF32, DTypeBF16, DTypeF16} {
		dst := make([]byte, n*to.Size())
		if err := DecodeFP8(dst, to, sec, heads); err != nil {
			t.Fatal(err)
		}
		for h := range heads {
			var amax float64
			for i := h * tok * hd; i < (h+1)*tok*hd; i++ {
				amax = math.Max(amax, math.Abs(float64(vals[i])))
			}
			for i := h * tok * hd; i < (h+1)*tok*hd; i++ {
				var got float64
				switch to {
				case DTypeF32:
					got = float64(math.Float32frombits(le.Uint32(dst[4*i:])))
				case DTypeBF16:
					got = float64(half.BF16ToF32(le.Uint16(dst[2*i:])))
				default:
					got = float64(half.F16ToF32(le.Uint16(dst[2*i:])))
				}
				x := float64(vals[i])
				// half-ulp of E4M3 relative (2^-4), or the subnormal step of the head's scale
				tol := math.Max(math.Abs(x)*(1.0/16+1.0/128), amax/448*0x1p-9)
				if to == DTypeF16 {
					tol += 1e-4 // f16's own subnormals for the 1e-2 head
				}
				if math.Abs(got-x) > tol {
					t.Fatalf("%v head %d elem %d: %g → %g (tol %g)", to, h, i, x, got, tol)
				}
			}
		}
	}
}

func TestFP8DecodeRejects(t *testing.T) {
	good := make([]byte, FP8Len(2, 8))
	for h := range 2 {
		le.PutUint32(good[4*h:], math.Float32bits(1))
	}
	dst := make([]byte, 8*4)
	if err := DecodeFP8(dst, DTypeF32, good, 2); err != nil {
		t.Fatal(err)
	}
	for name, scale := range map[string]float32{"zero": 0, "negative": -1, "nan": float32(math.NaN()), "inf": float32(math.Inf(1))} {
		b := append([]byte(nil), good...)
		le.PutUint32(b[4:], math.Float32bits(scale))
		if err := DecodeFP8(dst, DTypeF32, b, 2); !errors.Is(err, ErrCorrupt) {
			t.Errorf("scale %s: %v", name, err)
		}
	}
	if err := DecodeFP8(dst, DTypeF32, good[:len(good)-1], 2); !errors.Is(err, ErrCorrupt) {
		t.Errorf("short section: %v", err)
	}
	if err := DecodeFP8(dst, DTypeF32, good, 3); err == nil {
		t.Error("heads not dividing the elements accepted")
	}
}

// FuzzFP8Decode: arbitrary peer bytes never panic, and a section that
// decodes re-encodes to the same length.
func FuzzFP8Decode(f *testing.F) {
	f.Add([]byte{0, 0, 0x80, 0x3f, 1, 2, 0x7f, 0xff}, uint8(1), uint8(4))
	f.Fuzz(func(t *testing.T, src []byte, heads, elems uint8) {
		h, n := int(heads%8)+1, int(elems)
		for _, to := range []DType{DTypeF32, DTypeBF16, DTypeF16} {
			dst := make([]byte, n*to.Size())
			if err := DecodeFP8(dst, to, src, h); err != nil {
				continue
			}
			if len(src) != FP8Len(h, n) {
				t.Fatalf("decoded a %d-byte section for %d elements over %d heads", len(src), n, h)
			}
		}
	})
}
