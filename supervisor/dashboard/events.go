package dashboard

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"
)

// serveEvents streams the cluster as Server-Sent Events: every Every, a
// "state" event (a State without its requests) and, when any request is
// new or changed since the last one sent to this client, a "requests"
// event with those requests (a JSON array, oldest first). The first events
// carry everything recent.
func (d *Dashboard) serveEvents(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	sent := map[string]string{} // request key → the version sent
	t := time.NewTicker(d.o.Every)
	defer t.Stop()
	for {
		st := d.State(r.Context())
		if r.Context().Err() != nil {
			return
		}
		var fresh []Request
		seen := make(map[string]string, len(st.Requests))
		for _, q := range st.Requests {
			v := fmt.Sprint(q.Done, q.CompletionTokens, q.Route, q.TTFT)
			seen[q.Key] = v
			if sent[q.Key] != v {
				fresh = append(fresh, q)
			}
		}
		sent = seen
		head := *st
		head.Requests = nil
		if err := writeEvent(w, "state", head); err != nil {
			return
		}
		if len(fresh) > 0 {
			if err := writeEvent(w, "requests", fresh); err != nil {
				return
			}
		}
		if err := rc.Flush(); err != nil {
			return
		}
		select {
		case <-r.Context().Done():
			return
		case <-t.C:
		}
	}
}

func writeEvent(w http.ResponseWriter, name string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "event: %s\ndata: %s\n\n", name, b)
	return err
}
