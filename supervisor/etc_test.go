package supervisor

import (
	"encoding/xml"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestSystemdUnit checks the plain unit in etc/ has what the supervisor's
// systemd integration relies on.
func TestSystemdUnit(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "etc", "systemd", "exo.service"))
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string][]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(line, "#") {
			keys[k] = append(keys[k], v)
		}
	}
	for k, want := range map[string]string{
		"Type": "notify", "NotifyAccess": "main", "ExecReload": "/bin/kill -HUP $MAINPID", "Restart": "on-failure",
		"WatchdogSec": "30", "KillMode": "mixed", "NoNewPrivileges": "yes", "ProtectSystem": "strict",
		"ExecStart":    "/usr/local/bin/exo supervise --config /etc/exo/cluster.toml",
		"ExecStartPre": "/usr/local/bin/exo config check /etc/exo/cluster.toml",
	} {
		if !slices.Contains(keys[k], want) {
			t.Errorf("%s = %q, want %q", k, keys[k], want)
		}
	}
}

func TestLaunchdPlist(t *testing.T) {
	f, err := os.Open(filepath.Join("..", "etc", "launchd", "org.exo-pd.exo.plist"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// A well-formed plist whose top dict has the keys launchd needs.
	var doc struct {
		Dict struct {
			Keys    []string `xml:"key"`
			Strings []string `xml:"string"`
			Array   struct {
				Strings []string `xml:"string"`
			} `xml:"array"`
		} `xml:"dict"`
	}
	if err := xml.NewDecoder(f).Decode(&doc); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"Label", "ProgramArguments", "RunAtLoad", "KeepAlive", "StandardErrorPath", "UserName"} {
		if !slices.Contains(doc.Dict.Keys, k) {
			t.Errorf("plist lacks %s", k)
		}
	}
	if got := strings.Join(doc.Dict.Array.Strings, " "); got != "/usr/local/bin/exo supervise --config /etc/exo/cluster.toml" {
		t.Errorf("ProgramArguments = %q", got)
	}
}
