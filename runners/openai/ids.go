package openai

import (
	"crypto/rand"
	"encoding/hex"
	"log/slog"
)

// NewID returns prefix and 24 random hex digits (96 bits), or gen(prefix)
// when gen is set (golden tests make ids deterministic). The OpenAI and
// Anthropic handlers and the generators' tool-call ids all use it.
func NewID(gen func(prefix string) string, prefix string) string {
	if gen != nil {
		return gen(prefix)
	}
	var b [12]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return prefix + hex.EncodeToString(b[:])
}

// LoggerOr returns l, or slog.Default() when l is nil.
func LoggerOr(l *slog.Logger) *slog.Logger {
	if l != nil {
		return l
	}
	return slog.Default()
}
