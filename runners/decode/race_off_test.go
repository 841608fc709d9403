//go:build !race

package decode

const raceDetector = false
