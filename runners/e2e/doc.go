// Package e2e holds the end-to-end tests of the runners: they build the exo
// binary once, start real `exo runner prefill` and `exo runner decode`
// processes on 127.0.0.1 with a test-generated tiny model and with
// SmolLM2-135M-Instruct, and check prefill/decode equivalence, faults on the
// KV wire (through a TCP proxy that can flip a byte or kill the prefill
// runner mid-stream), the OpenAI API and concurrency. It has no non-test
// code and must not be imported.
package e2e
