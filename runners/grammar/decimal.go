package grammar

import (
	"encoding/json"
	"fmt"
	"math/big"
)

// Bounds and multipleOf on numbers (and multipleOf on integers) are
// enforced over the exact decimal value of the text so far: a number
// under them is written without an exponent, its digits (at most
// maxDecDigits) kept in the frame, and a byte is taken only when some
// number the text can still become lies within the bounds and is a
// multiple — found as the candidate nearest the prefix in each interval
// of values the prefix can reach, with the digits it needs counted. So
// that a candidate always fits the digits, bounds and multipleOf have at
// most maxDecFrac fraction digits and magnitudes below maxDecMagnitude.

const (
	maxDecDigits    = 18 // digits of one number (they fit a uint64)
	maxDecFrac      = 6  // fraction digits of a bound or multipleOf
	maxDecMagnitude = 1e9
)

// decCons is a number node's exact constraints (nil bound: none).
type decCons struct {
	lo, hi     *big.Rat
	loEx, hiEx bool
	mult       *big.Rat
}

// A decimal frame keeps its sign in u8 (1: negative), its digits in pos
// and their value in mask (fraction digits included), the fraction's
// digit count in ws.

func decRat(v any, key, path string) (*big.Rat, error) {
	var s string
	switch x := v.(type) {
	case json.Number:
		s = x.String()
	case float64:
		s = fmt.Sprint(x)
	default:
		return nil, schemaErr(path, "%s must be a number", key)
	}
	r, ok := new(big.Rat).SetString(s)
	if !ok {
		return nil, schemaErr(path, "%s: %q is not a number", key, s)
	}
	lim := new(big.Rat).SetFloat64(maxDecMagnitude)
	if new(big.Rat).Abs(r).Cmp(lim) >= 0 || fracDigits(r) > maxDecFrac {
		return nil, &UnsupportedError{Keywords: []string{fmt.Sprintf("%s %s (on numbers: below 10^9 in magnitude, at most %d fraction digits)", key, s, maxDecFrac)}, Path: pathOrRoot(path)}
	}
	return r, nil
}

// fracDigits is the decimal fraction digits r needs (-1: none do).
func fracDigits(r *big.Rat) int {
	d := new(big.Int).Set(r.Denom())
	two, five := big.NewInt(2), big.NewInt(5)
	a, b := 0, 0
	m := new(big.Int)
	for d.Cmp(big.NewInt(1)) > 0 {
		switch {
		case m.Mod(d, two).Sign() == 0:
			d.Div(d, two)
			a++
		case m.Mod(d, five).Sign() == 0:
			d.Div(d, five)
			b++
		default:
			return 1 << 20
		}
	}
	return max(a, b)
}

// intDigits is the digits of r's integer part (1 for |r| < 1).
func intDigits(r *big.Rat) int {
	q := new(big.Int).Quo(new(big.Int).Abs(r.Num()), r.Denom())
	if q.Sign() == 0 {
		return 1
	}
	return len(q.String())
}

func pow10(k int) *big.Rat {
	return new(big.Rat).SetInt(new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(k)), nil))
}

// value is the exact value of decimal frame f's digits.
func decValue(f *frame) *big.Rat {
	v := new(big.Rat).SetInt(new(big.Int).SetUint64(f.mask))
	if f.ws > 0 {
		v.Quo(v, pow10(int(f.ws)))
	}
	if f.u8 == 1 {
		v.Neg(v)
	}
	return v
}

// ok reports whether v meets the constraints.
func (c *decCons) ok(v *big.Rat) bool {
	if c.lo != nil {
		if k := v.Cmp(c.lo); k < 0 || k == 0 && c.loEx {
			return false
		}
	}
	if c.hi != nil {
		if k := v.Cmp(c.hi); k > 0 || k == 0 && c.hiEx {
			return false
		}
	}
	if c.mult != nil {
		q := new(big.Rat).Quo(v, c.mult)
		if !q.IsInt() {
			return false
		}
	}
	return true
}

// decStep updates g (f after byte b, its number state set) and reports
// whether some number it can still become meets n's constraints.
func decStep(n *node, f, g *frame, b byte) bool {
	switch {
	case b == '-':
		g.u8 = 1
	case b == '.':
	case b >= '0' && b <= '9':
		if g.pos = f.pos + 1; g.pos > maxDecDigits {
			return false
		}
		g.mask = f.mask*10 + uint64(b-'0')
		if g.st == sNumFrac {
			g.ws = f.ws + 1
		}
	default:
		return false // no exponent under exact constraints
	}
	return decFeasible(n, g)
}

// decFeasible reports whether frame g (a prefix of a number) can still
// become a number that meets n's constraints within the digits left.
func decFeasible(n *node, g *frame) bool {
	c := n.dec
	neg := g.u8 == 1
	left := maxDecDigits - int(g.pos)
	D := new(big.Rat).SetInt(new(big.Int).SetUint64(g.mask))
	one := big.NewRat(1, 1)
	switch g.st {
	case sNumMinus: // any magnitude of 1..left integer digits
		return c.hit(n, neg, new(big.Rat), pow10(left), 0, false, 0)
	case sNumZero:
		return c.hit(n, neg, new(big.Rat), one, 0, false, 1)
	case sNumInt:
		for k := 0; k <= left; k++ {
			a := new(big.Rat).Mul(D, pow10(k))
			b := new(big.Rat).Mul(new(big.Rat).Add(D, one), pow10(k))
			if c.hit(n, neg, a, b, 0, false, int(g.pos)+k) {
				return true
			}
		}
		return false
	case sNumDot, sNumFrac:
		s := pow10(int(g.ws))
		a := new(big.Rat).Quo(D, s)
		b := new(big.Rat).Quo(new(big.Rat).Add(D, one), s)
		return c.hit(n, neg, a, b, int(g.ws), true, int(g.pos)-int(g.ws))
	}
	return false
}

// hit reports whether some number whose magnitude lies in [a, b) (with
// its fd fraction digits written, a fraction begun if dot, its integer
// part of intD digits) meets the constraints and needs no more than
// maxDecDigits digits: the candidate nearest the prefix is tried.
func (c *decCons) hit(n *node, neg bool, a, b *big.Rat, fd int, dot bool, intD int) bool {
	// Signed interval [lo, hi) or (lo, hi], and the end the prefix is at.
	var cand *big.Rat
	if !neg {
		// [a, b): the smallest allowed value >= a.
		cand = new(big.Rat).Set(a)
		ex := false
		if c.lo != nil && c.lo.Cmp(cand) >= 0 {
			cand.Set(c.lo)
			ex = c.loEx
		}
		if cand = c.nearest(n, cand, ex, true, fd); cand == nil || cand.Cmp(b) >= 0 {
			return false
		}
		if c.hi != nil {
			if k := cand.Cmp(c.hi); k > 0 || k == 0 && c.hiEx {
				return false
			}
		}
	} else {
		// (-b, -a]: the largest allowed value <= -a.
		cand = new(big.Rat).Neg(a)
		ex := false
		if c.hi != nil && c.hi.Cmp(cand) <= 0 {
			cand.Set(c.hi)
			ex = c.hiEx
		}
		nb := new(big.Rat).Neg(b)
		if cand = c.nearest(n, cand, ex, false, fd); cand == nil || cand.Cmp(nb) <= 0 {
			return false
		}
		if c.lo != nil {
			if k := cand.Cmp(c.lo); k < 0 || k == 0 && c.loEx {
				return false
			}
		}
	}
	frac := fracDigits(cand)
	if n.integer && frac > 0 {
		return false
	}
	frac = max(frac, fd)
	if dot {
		frac = max(frac, 1)
	}
	return max(intD, intDigits(cand))+frac <= maxDecDigits
}

// nearest returns the allowed value nearest x upwards (up) or downwards,
// x itself excluded when ex: the next multiple, or for none the next
// value one digit past the written fraction (or integer, on integers).
func (c *decCons) nearest(n *node, x *big.Rat, ex, up bool, fd int) *big.Rat {
	if c.mult != nil {
		q := new(big.Rat).Quo(x, c.mult)
		k := new(big.Int).Quo(q.Num(), q.Denom()) // truncated toward zero
		kr := new(big.Rat).SetInt(k)
		if up && kr.Cmp(q) < 0 {
			kr.Add(kr, big.NewRat(1, 1))
		}
		if !up && kr.Cmp(q) > 0 {
			kr.Sub(kr, big.NewRat(1, 1))
		}
		v := new(big.Rat).Mul(kr, c.mult)
		if ex && v.Cmp(x) == 0 {
			if up {
				v.Add(v, c.mult)
			} else {
				v.Sub(v, c.mult)
			}
		}
		return v
	}
	if n.integer && !x.IsInt() {
		q := new(big.Int).Quo(x.Num(), x.Denom())
		v := new(big.Rat).SetInt(q)
		if up && v.Cmp(x) < 0 {
			v.Add(v, big.NewRat(1, 1))
		}
		if !up && v.Cmp(x) > 0 {
			v.Sub(v, big.NewRat(1, 1))
		}
		return v
	}
	if !ex {
		return new(big.Rat).Set(x)
	}
	step := big.NewRat(1, 1)
	if !n.integer {
		step = new(big.Rat).Quo(step, pow10(max(fd, fracDigits(x), 0)+1))
	}
	if up {
		return new(big.Rat).Add(x, step)
	}
	return new(big.Rat).Sub(x, step)
}
