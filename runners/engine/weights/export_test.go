package weights

// GGUFTestBuilder is the tests' GGUF writer, for the external tests of this
// package (which may import testmodel; this package's own tests cannot).
type GGUFTestBuilder = ggufBuilder
