// Package kvwire owns the KV wire protocol between a prefill runner (server)
// and a decode runner (client), specified in docs/PROTOCOL.md: the versioned
// handshake, challenge-response authentication, the request (for every
// layer, or a pipeline stage's layer range: §19), the self-describing
// header, CRC32C-checked chunk, state, done and error frames,
// admission, flow control, cancellation and timeouts, striping one
// transfer over several authenticated connections (stripe.go), and the
// choice of and failover between prefill endpoints.
//
// It is model-independent: it must not import runners/engine or any model
// code. A KV fingerprint is an opaque [32]byte and the wire dtypes are this
// package's own enum; the runners map them to engine types. The server takes
// KV from a Producer through an Emitter; the client hands it to a Sink.
package kvwire
