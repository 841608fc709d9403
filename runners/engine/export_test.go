package engine

// Gemma3Settings exposes a parsed config's Gemma 3 settings to the
// external tests (nil for another architecture).
func Gemma3Settings(c *Config) *gemma3Config {
	g, _ := c.ext.(*gemma3Config)
	return g
}

// WeightShapes maps a block's weight names (as its Weights lists them) to
// the shapes of the arrays it loaded (a Linear by its weight's shape; the
// conv taps of a Gated DeltaNet layer as [C]), for the tests that check
// the shard kinds against what a tensor-parallel rank holds.
func WeightShapes(b Block) map[string][]int {
	out := map[string][]int{}
	put := func(name string, a Array) {
		if name != "" && a != nil {
			out[name] = a.Shape()
		}
	}
	d := b.(*decoderLayer)
	put(d.preMixN, d.preMix)
	put(d.postMixN, d.postMix)
	put(d.preFFN, d.preFF)
	put(d.postFFN, d.postFF)
	switch m := d.mix.(type) {
	case *attention:
		p := m.prefix
		put(p+"q_proj", m.q.W)
		put(p+"k_proj", m.k.W)
		put(p+"v_proj", m.v.W)
		put(p+"o_proj", m.o.W)
		put(p+"q_norm.weight", m.qNorm)
		put(p+"k_norm.weight", m.kNorm)
		put(p+"sinks", m.sinks)
	case *deltaBlock:
		p := m.prefix
		put(p+"in_proj_qkvz", m.qkvz.W)
		put(p+"in_proj_ba", m.ba.W)
		put(p+"in_proj_qkv", m.qkv.W)
		put(p+"in_proj_z", m.z.W)
		put(p+"in_proj_b", m.b.W)
		put(p+"in_proj_a", m.a.W)
		put(p+"out_proj", m.out.W)
		put(p+"conv1d.weight", m.taps[0])
		put(p+"A_log", m.aLog)
		put(p+"dt_bias", m.dtBias)
		put(p+"norm.weight", m.norm)
	}
	switch f := d.ff.(type) {
	case *mlp:
		put(f.prefix+"gate_proj", f.gate.W)
		put(f.prefix+"up_proj", f.up.W)
		put(f.prefix+"down_proj", f.down.W)
	case *moeBlock:
		put(f.routerName, f.router.W)
		put(f.gateName, f.gate.W)
		put(f.upName, f.up.W)
		put(f.downName, f.down.W)
		if se := f.shared; se != nil {
			p := f.prefix
			put(p+"shared_expert.gate_proj", se.gate.W)
			put(p+"shared_expert.up_proj", se.up.W)
			put(p+"shared_expert.down_proj", se.down.W)
			put(p+"shared_expert_gate", se.scale.W)
		}
	}
	return out
}
