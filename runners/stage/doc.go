// Package stage owns the stage link and the stage runners of a pipelined
// decode model on the cpu backend (DESIGN.md §13, docs/PROTOCOL.md "Stage
// link"): the framed, authenticated, CRC-checked TCP protocol between
// stages (wire.go, link.go: its messages over runners/internal/link's
// framing and handshake), the runner of a stage after the first
// (Node: its layers, and on the last stage the logits and the request's
// Picker, which sends the picked tokens back to stage 0), and stage 0's
// model (Ring: a decode.PickingModel whose caches are composites of its own
// stage cache and the sequence's caches on the later stages, whose steps
// send hidden states down the ring and wait for the picked tokens), and
// remote prefill into a pipeline (Remote: each stage fetches its own layer
// range from the prefill runner over runners/kvwire, all or none commit).
// A stage's layers (Layers) are a loaded engine model or, for a stage
// that is a tensor group, runners/tensor's Model on the group's rank 0,
// which runs each step on every rank; such a stage links into the ring
// only while its group is whole (RunnerConfig.Ranks, Health).
//
// The decode runner's admission, batching, prefix cache, stop sequences
// and streaming stay in runners/decode, which drives a Ring as it drives
// an engine.Model. This package must not import supervisor/ (nor
// runners/kvwire's internals: the framing, the Hello and the handshake
// are runners/internal/link's, shared with the tensor link; the stage
// link's own messages, limits and peer checks are here).
package stage
