package sample

import "strings"

// StopMatcher finds stop sequences in streamed text that arrives in
// arbitrary pieces (token boundaries fall anywhere inside a stop string). It
// holds back the shortest tail that could still become a stop sequence, so
// text it emits never contains (part of) a stop sequence. Not safe for
// concurrent use.
type StopMatcher struct {
	stops   []string
	pending string
	stopped bool
	matched string
}

// Matched returns the stop sequence that was seen ("" before one is).
func (m *StopMatcher) Matched() string { return m.matched }

// NewStopMatcher returns a matcher for stops (empty strings are ignored).
func NewStopMatcher(stops []string) *StopMatcher {
	m := &StopMatcher{}
	for _, s := range stops {
		if s != "" {
			m.stops = append(m.stops, s)
		}
	}
	return m
}

// Push adds text and returns what may be shown now. stopped is true once a
// stop sequence has been seen: emit is then the text before it and the
// stop sequence and everything after are dropped; later calls return "",
// true.
func (m *StopMatcher) Push(text string) (emit string, stopped bool) {
	if m.stopped {
		return "", true
	}
	m.pending += text
	if len(m.stops) == 0 {
		emit, m.pending = m.pending, ""
		return emit, false
	}
	first := -1
	for _, s := range m.stops {
		if i := strings.Index(m.pending, s); i >= 0 && (first < 0 || i < first) {
			first, m.matched = i, s
		}
	}
	if first >= 0 {
		emit = m.pending[:first]
		m.pending = ""
		m.stopped = true
		return emit, true
	}
	hold := 0
	for _, s := range m.stops {
		for l := min(len(s)-1, len(m.pending)); l > hold; l-- {
			if strings.HasSuffix(m.pending, s[:l]) {
				hold = l
				break
			}
		}
	}
	cut := len(m.pending) - hold
	emit, m.pending = m.pending[:cut], m.pending[cut:]
	return emit, false
}

// Flush returns the held-back text at the end of generation (none after a
// stop) and empties the matcher.
func (m *StopMatcher) Flush() string {
	if m.stopped {
		return ""
	}
	out := m.pending
	m.pending = ""
	return out
}

// Stopped reports whether a stop sequence has been seen.
func (m *StopMatcher) Stopped() bool { return m.stopped }
