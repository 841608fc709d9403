// Package wireauth owns the challenge-response construction the runners'
// TCP protocols share (the KV wire, runners/kvwire, and the stage and
// tensor links through runners/internal/link): an HMAC-SHA256 with the cluster secret over the
// protocol's label, the prover's role and both peers' nonces, so the
// secret never crosses the wire and a proof from one protocol, version or
// direction is no proof in another. It holds no state and touches no
// connection.
package wireauth

import (
	"crypto/hmac"
	"crypto/sha256"
	"io"
)

// MAC is HMAC-SHA256(secret, label || " " || role || sn || cn): label
// names the protocol and its version ("exo-kvwire/4"), role the prover
// ("client" or "server"), sn and cn the server's and the client's nonces.
func MAC(secret []byte, label, role string, sn, cn *[32]byte) []byte {
	m := hmac.New(sha256.New, secret)
	io.WriteString(m, label)
	io.WriteString(m, " ")
	io.WriteString(m, role)
	m.Write(sn[:])
	m.Write(cn[:])
	return m.Sum(nil)
}

// Equal compares two proofs in constant time.
func Equal(a, b []byte) bool { return hmac.Equal(a, b) }
