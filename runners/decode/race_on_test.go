//go:build race

package decode

// raceDetector: built with -race (numeric tests that the plain run covers
// skip themselves: ten times slower and nothing concurrent to check).
const raceDetector = true
