package testutil

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
)

// Ports returns the first of n consecutive TCP ports that were free a
// moment ago on every address, for a server a test starts later (a
// supervisor's runner_port_base and API port, a runner's --listen).
//
// The ports lie outside the kernel's ephemeral range (Linux's
// ip_local_port_range, 32768–60999 by default), where a port the kernel
// picked for a listener on :0 would be: that range is also where every
// outgoing connection on the machine takes its local port, so on a busy
// machine one of them can take such a port between the test closing its
// probe listener and the server binding it (a runner that cannot listen
// crash-loops and is "never ready"). Below the range only servers that
// ask for a port by number bind, and the start is random, so test
// processes running at once seldom pick the same block; a block with a
// port in use is skipped.
func Ports(t testing.TB, n int) int {
	t.Helper()
	lo, hi := portRange()
	for range 200 {
		base := lo + rand.IntN(hi-lo-n)
		if blockFree(base, n) {
			return base
		}
	}
	t.Fatalf("no %d consecutive free ports in [%d, %d)", n, lo, hi)
	return 0
}

// Addr is a 127.0.0.1 address on a port Ports picked.
func Addr(t testing.TB) string {
	t.Helper()
	return fmt.Sprintf("127.0.0.1:%d", Ports(t, 1))
}

// portRange is where Ports picks: the wider of [10000, the ephemeral
// range's start) and (its end, 65000].
func portRange() (lo, hi int) {
	elo, ehi := 32768, 60999
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			a, err1 := strconv.Atoi(f[0])
			z, err2 := strconv.Atoi(f[1])
			if err1 == nil && err2 == nil && a <= z {
				elo, ehi = a, z
			}
		}
	}
	if below, above := elo-10000, 65000-ehi; below >= above && below > 1000 {
		return 10000, elo
	} else if above > 1000 {
		return ehi + 1, 65001
	}
	return 10000, 65001 // no room outside the range: anywhere, still checked
}

func blockFree(base, n int) bool {
	for p := base; p < base+n; p++ {
		l, err := net.Listen("tcp", fmt.Sprintf(":%d", p))
		if err != nil {
			return false
		}
		l.Close()
	}
	return true
}
