// Package version holds the build's version string, set by the linker
// (-ldflags "-X github.com/exo-pd/exo-pd/cmd/internal/version.Version=…").
package version

import "runtime/debug"

// Version is overridden at link time by packaging (Nix sets it).
var Version = ""

// String returns the version, falling back to the module build info.
func String() string {
	if Version != "" {
		return Version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}
