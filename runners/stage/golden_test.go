package stage

import (
	"crypto/sha256"
	"encoding/hex"
	"testing"
)

// TestWireGolden: the stage link's frames and hello are byte for byte
// those of version 2 before the framing moved to runners/internal/link
// (the digest was taken from that code), so a stage of either build links
// with the other.
func TestWireGolden(t *testing.T) {
	h := sha256.New()
	for _, m := range sampleMessages() {
		b, err := encode(m)
		if err != nil {
			t.Fatalf("%T: %v", m, err)
		}
		h.Write(b)
	}
	b, _ := encode(keepalive{})
	h.Write(b)
	b, _ = encode(ErrorFrame{Code: CodeAuth, Reason: string(make([]byte, 2000))}) // cut to 1024
	h.Write(b)
	hl := Hello{Version: Version, Flags: flagAuth | flagGroup, Stage: 1, Stages: 3, First: 4, End: 8, Fingerprint: [32]byte{1, 2}, Nonce: [32]byte{3, 4}}
	h.Write(hl.encode())
	if got, want := hex.EncodeToString(h.Sum(nil)), "14c500c636ff2be249d720bc416472e8148b0acebda20038515ea3e241f21b2b"; got != want {
		t.Fatalf("the stage link's bytes changed: digest %s, version 2's %s (bump Version and say so in PROTOCOL.md S7)", got, want)
	}
}
