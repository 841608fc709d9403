package dashboard

import (
	"sync"
	"time"

	"github.com/exo-pd/exo-pd/supervisor/process"
)

// historyLen is how many state changes are kept per runner.
const historyLen = 16

// Transition is one change of a runner's state.
type Transition struct {
	At       time.Time `json:"at"`
	State    string    `json:"state"`
	Restarts int       `json:"restarts"`
	// Reason is why it left its previous state where one is known (the
	// exit that sent it to backoff).
	Reason string `json:"reason,omitempty"`
}

// History records each runner's state changes as the supervisor sees them
// (process.Options.OnChange), so a restart shows even when it is over
// before anyone looks. Safe for concurrent use.
type History struct {
	mu sync.Mutex
	by map[string][]Transition
}

// NewHistory returns an empty History.
func NewHistory() *History { return &History{by: map[string][]Transition{}} }

// Observe records st if its state differs from the last one recorded.
func (h *History) Observe(st process.Status) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ts := h.by[st.Name]
	if n := len(ts); n > 0 && ts[n-1].State == string(st.State) {
		return
	}
	t := Transition{At: st.Since, State: string(st.State), Restarts: st.Restarts}
	if t.At.IsZero() {
		t.At = time.Now()
	}
	if st.State == process.Backoff || st.State == process.CrashLoop {
		t.Reason = st.LastExit
		if st.LastError != "" {
			t.Reason += ": " + st.LastError
		}
	}
	ts = append(ts, t)
	if len(ts) > historyLen {
		ts = ts[len(ts)-historyLen:]
	}
	h.by[st.Name] = ts
}

// Of returns runner's recorded changes, oldest first.
func (h *History) Of(runner string) []Transition {
	if h == nil {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Transition(nil), h.by[runner]...)
}
