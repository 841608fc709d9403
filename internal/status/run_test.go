package status

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/supervisor/dashboard"
)

// Run reads the API key from the cluster file and sends it, passes the
// supervisor's JSON through with JSON set, renders it otherwise, and
// refuses what it cannot use with an error naming it.
func TestRun(t *testing.T) {
	const key = "k3y"
	const state = `{"cluster":"lab","host":"spark","hosts":[{"name":"spark","up":true,"same_config":true}]}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != dashboard.StatePath {
			http.NotFound(w, r)
			return
		}
		if r.Header.Get("Authorization") != "Bearer "+key {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		w.Write([]byte(state))
	}))
	defer srv.Close()

	dir := t.TempDir()
	cluster := func(name, keyFile string) string {
		p := filepath.Join(dir, name)
		src := "[cluster]\nname = \"lab\"\n\n[hosts.spark]\naddress = \"127.0.0.1\"\nbackend = \"cpu\"\n\n[api]\napi_key_file = \"" + keyFile + "\"\n\n[[models]]\nname = \"m\"\nsource = \"org/m\"\ndecode = { hosts = [\"spark\"] }\n"
		if err := os.WriteFile(p, []byte(src), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	goodKey := filepath.Join(dir, "key")
	badKey := filepath.Join(dir, "bad-key")
	for p, k := range map[string]string{goodKey: key + "\n", badKey: "other"} {
		if err := os.WriteFile(p, []byte(k), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	good, bad := cluster("good.toml", goodKey), cluster("bad.toml", badKey)

	tests := []struct {
		name    string
		o       Options
		want    string // a substring of the output
		wantErr string // "" = no error, else a substring of it
		usage   bool   // the error is a UsageError
	}{
		{"json with key", Options{API: srv.URL, Config: good, JSON: true}, state, "", false},
		{"tables with key", Options{API: srv.URL + "/", Config: good}, "cluster lab, host spark", "", false},
		{"wrong key", Options{API: srv.URL, Config: bad}, "", "status from " + srv.URL + ": 401", false},
		{"named cluster file missing", Options{API: srv.URL, Config: filepath.Join(dir, "none.toml")}, "", "status: ", true},
		{"unusable url", Options{API: "http://bad host", Config: good}, "", "invalid", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			err := Run(context.Background(), &out, tt.o)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Run: %v", err)
				}
				if !strings.Contains(out.String(), tt.want) {
					t.Errorf("output lacks %q:\n%s", tt.want, out.String())
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("got %v, want an error containing %q", err, tt.wantErr)
			}
			if ue := (UsageError{}); errors.As(err, &ue) != tt.usage {
				t.Errorf("%v: UsageError %v, want %v", err, !tt.usage, tt.usage)
			}
		})
	}
}

// TestRunListenAddress: without --api, status asks the gateway where the
// cluster file binds it: [api] listen when it names one address (the
// gateway is not on 127.0.0.1 then), 127.0.0.1 when it binds them all.
func TestRunListenAddress(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Skipf("127.0.0.2 is not usable here: %v", err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"cluster":"lab","host":"spark"}`))
	}))
	srv.Listener.Close()
	srv.Listener = l
	srv.Start()
	defer srv.Close()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	for _, listen := range []string{"127.0.0.2"} {
		p := filepath.Join(t.TempDir(), "cluster.toml")
		src := "[cluster]\nname = \"lab\"\n\n[hosts.spark]\naddress = \"127.0.0.1\"\nbackend = \"cpu\"\n\n[api]\nlisten = \"" + listen + "\"\nport = " + port + "\n\n[[models]]\nname = \"m\"\nsource = \"org/m\"\ndecode = { hosts = [\"spark\"] }\n"
		if err := os.WriteFile(p, []byte(src), 0o600); err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		if err := Run(context.Background(), &out, Options{Config: p, JSON: true}); err != nil || !strings.Contains(out.String(), `"host":"spark"`) {
			t.Errorf("listen %s: %v\n%s", listen, err, out.String())
		}
	}
}
