package supervisor

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/supervisor/dashboard"
)

// TestDashboardBehindTheKey: with [api] api_key_file, the dashboard's page
// and files (which hold no data) are served without the key, with a
// Content-Security-Policy; the status API is refused without the key and
// answers with it, listing this host and its runners.
func TestDashboardBehindTheKey(t *testing.T) {
	keyFile := filepath.Join(t.TempDir(), "key")
	os.WriteFile(keyFile, []byte("k3y\n"), 0o600)
	h := start(t, clusterFile(freePort(t), "a=src-a")+fmt.Sprintf("\n[api]\napi_key_file = %q\n", keyFile))
	get := func(path, key string) *http.Response {
		req, _ := http.NewRequest("GET", "http://"+h.api+path, nil)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	for _, p := range dashboard.ShellPaths {
		r := get(p, "")
		if r.StatusCode != 200 || !strings.Contains(r.Header.Get("Content-Security-Policy"), "script-src 'self'") {
			t.Errorf("%s without the key: %d, CSP %q", p, r.StatusCode, r.Header.Get("Content-Security-Policy"))
		}
	}
	for _, p := range []string{dashboard.StatePath, dashboard.HostPath, dashboard.EventsPath} {
		if r := get(p, ""); r.StatusCode != 401 {
			t.Errorf("%s without the key: %d", p, r.StatusCode)
		}
		if r := get(p, "wrong"); r.StatusCode != 401 {
			t.Errorf("%s with a wrong key: %d", p, r.StatusCode)
		}
	}
	r := get(dashboard.StatePath, "k3y")
	var st dashboard.State
	if err := json.NewDecoder(r.Body).Decode(&st); err != nil || r.StatusCode != 200 {
		t.Fatalf("%s with the key: %d %v", dashboard.StatePath, r.StatusCode, err)
	}
	if st.Host != "h" || len(st.Hosts) != 1 || !st.Hosts[0].Up || len(st.Models) != 1 || len(st.Models[0].Runners) != 2 {
		t.Fatalf("state: %+v", st)
	}
	for _, mr := range st.Models[0].Runners {
		if mr.State != "ready" || len(mr.History) < 2 || mr.History[len(mr.History)-1].State != "ready" {
			t.Errorf("runner %s: %+v", mr.Runner, mr)
		}
	}
}
