// Package e2e holds the end-to-end tests of the runners: they build the exo
// binary once, start real `exo runner prefill` and `exo runner decode`
// processes on 127.0.0.1 with a test-generated tiny model and with
// SmolLM2-135M-Instruct, and check prefill/decode equivalence, faults on the
// KV wire (through a TCP proxy that can flip a byte or kill the prefill
// runner mid-stream), the OpenAI API and concurrency. Routing tests shape
// the link with a rate-limiting TCP proxy (shaper) and give each runner a
// simulated prefill rate with the runners' test-only flag
// --test-slow-prefill-tokens-per-sec (hidden from the usage text; it caps
// prefill at that rate and logs a TEST ONLY warning; never for production).
// It has no non-test code and must not be imported.
package e2e
