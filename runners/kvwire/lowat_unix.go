//go:build linux || darwin

package kvwire

import (
	"net"

	"golang.org/x/sys/unix"
)

// limitUnsent caps the bytes a striped connection keeps unsent in its
// kernel send queue (TCP_NOTSENT_LOWAT), so its writer takes the next
// chunk from the shared queue only when the link has drained the last
// one: a slower connection then carries fewer chunks, instead of each
// socket buffer swallowing megabytes up front. Bytes in flight (the
// congestion window) are not capped. Best effort: an error leaves the
// connection as it is.
func limitUnsent(c net.Conn, bytes int) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return
	}
	rc.Control(func(fd uintptr) {
		unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_NOTSENT_LOWAT, bytes)
	})
}
