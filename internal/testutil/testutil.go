// Package testutil holds the helpers tests share across runners/ and
// supervisor/ (which must not import each other): waiting on state with a
// deadline instead of sleeping, reading a process's log records by key
// instead of matching its lines with regular expressions, picking ports
// for servers a test starts where no outgoing connection can take them,
// serving on loopback until the test ends (Serve, Peer), and skipping a
// test whose outside dependency is missing, or failing it where
// $EXO_REQUIRE_TEST_DEPS requires it (Missing). It must not import any
// package of this module, and only tests import it.
package testutil

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// Until polls cond until it reports true or timeout has passed, and says
// which. The pause between polls grows from 1 ms to 50 ms: a condition that
// holds at once costs nothing, one that takes seconds is not polled hot.
// It is safe on any goroutine.
func Until(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	pause := time.Millisecond
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return cond() // one last look: the deadline may have passed while it became true
		}
		time.Sleep(pause)
		pause = min(2*pause, 50*time.Millisecond)
	}
}

// Eventually fails the test (t.Fatalf, so only on the test goroutine) when
// cond has not reported true within timeout; what (formatted with args)
// says what was waited for.
func Eventually(t testing.TB, cond func() bool, timeout time.Duration, what string, args ...any) {
	t.Helper()
	if !Until(timeout, cond) {
		t.Fatalf("after %v: "+what, append([]any{timeout}, args...)...)
	}
}

// Record is one log line of a process that logs with slog's text handler
// (logfmt): its attributes by key. Tests read the facts a process logs by
// key, never by the order its attributes happen to be written in.
type Record map[string]string

// ParseRecord parses one logfmt line as slog.TextHandler writes it:
// key=value pairs separated by spaces, a value quoted (Go syntax) when it
// has spaces, quotes or '='. ok is false for a line that is not logfmt
// (no msg key), such as a panic's output.
func ParseRecord(line string) (r Record, ok bool) {
	r = Record{}
	for s := strings.TrimSpace(line); s != ""; s = strings.TrimLeft(s, " ") {
		eq := strings.IndexByte(s, '=')
		if eq <= 0 || strings.ContainsAny(s[:eq], " \"") {
			return r, false
		}
		key, rest := s[:eq], s[eq+1:]
		var val string
		if strings.HasPrefix(rest, `"`) {
			q, err := strconv.QuotedPrefix(rest)
			if err != nil {
				return r, false
			}
			val, _ = strconv.Unquote(q)
			rest = rest[len(q):]
		} else if sp := strings.IndexByte(rest, ' '); sp >= 0 {
			val, rest = rest[:sp], rest[sp:]
		} else {
			val, rest = rest, ""
		}
		r[key] = val
		s = rest
	}
	_, ok = r["msg"]
	return r, ok
}

// Records returns the records of logs (many lines) whose msg is msg, in
// order; msg "" returns every record.
func Records(logs, msg string) []Record {
	var out []Record
	for _, line := range strings.Split(logs, "\n") {
		if r, ok := ParseRecord(line); ok && (msg == "" || r["msg"] == msg) {
			out = append(out, r)
		}
	}
	return out
}
