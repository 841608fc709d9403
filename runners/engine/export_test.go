package engine

// Gemma3Settings exposes a parsed config's Gemma 3 settings to the
// external tests (nil for another architecture).
func Gemma3Settings(c *Config) *gemma3Config {
	g, _ := c.ext.(*gemma3Config)
	return g
}
