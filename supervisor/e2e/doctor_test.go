package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

type doctorCheck struct {
	Name, Status, Detail, Fix string
	Data                      map[string]any
}

type doctorReport struct {
	Host   string
	OK     bool
	Checks []doctorCheck
}

// doctor runs `exo doctor --json` and returns its report and exit code.
func doctor(t *testing.T, exe string, args ...string) (doctorReport, int) {
	t.Helper()
	cmd := exec.Command(exe, append([]string{"doctor", "--json", "--timeout", "2s"}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	var rep doctorReport
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("doctor %v: %v\n%s\n%s", args, err, out.Bytes(), errb.Bytes())
	}
	return rep, code
}

// find returns the checks whose name contains sub.
func (r doctorReport) find(sub string) []doctorCheck {
	var out []doctorCheck
	for _, c := range r.Checks {
		if strings.Contains(c.Name, sub) {
			out = append(out, c)
		}
	}
	return out
}

func (r doctorReport) String() string {
	var b strings.Builder
	for _, c := range r.Checks {
		fmt.Fprintf(&b, "  %-4s %s: %s | fix: %s\n", c.Status, c.Name, c.Detail, c.Fix)
	}
	return b.String()
}

// expect fails unless exactly the checks named with sub have status, and
// (for failures) a fix containing fix.
func (r doctorReport) expect(t *testing.T, sub, status, fix string) {
	t.Helper()
	cs := r.find(sub)
	if len(cs) == 0 {
		t.Errorf("no check named %q in\n%s", sub, r)
		return
	}
	for _, c := range cs {
		if c.Status != status || !strings.Contains(c.Fix, fix) {
			t.Errorf("check %q: %s %q (fix %q); want %s with a fix containing %q", c.Name, c.Status, c.Detail, c.Fix, status, fix)
		}
	}
}

// TestDoctor: `exo doctor` over a two-host loopback cluster (spark at
// 127.0.0.2 with the prefill runner, mac at 127.0.0.3 with decode): all
// healthy with a measured link; then a different cluster file, a wrong
// secret, a port taken and a host whose ports are unreachable, each
// reported with its fix.
func TestDoctor(t *testing.T) {
	if testing.Short() {
		t.Skip("builds exo and runs real runners")
	}
	needLoopbackHosts(t)
	_, dir, exe, model := buildExoAndModel(t)

	cfgPath, secret := filepath.Join(dir, "cluster.toml"), filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte("right secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base, apiPort := freePort(t), freePort(t)
	cfg := cluster(base, model, secret, "mac") + fmt.Sprintf("\n[api]\nport = %d\n", apiPort)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	spark, mac := startTwoHosts(t, exe, dir, cfgPath, apiPort)
	spark.waitRunners(t, "tiny-prefill")
	mac.waitRunners(t, "tiny-decode")

	// 1. Healthy, seen from both hosts; mac measures its link to spark.
	for _, hn := range []string{"spark", "mac"} {
		rep, code := doctor(t, exe, "--config", cfgPath, "--host", hn, "--probe-mib", "16")
		if code != 0 || !rep.OK {
			t.Fatalf("doctor --host %s: exit %d\n%s", hn, code, rep)
		}
	}
	rep, _ := doctor(t, exe, "--config", cfgPath, "--host", "mac", "--probe-mib", "16")
	rep.expect(t, "host spark: cluster file", "ok", "")
	rep.expect(t, "host spark: clock", "ok", "")
	rep.expect(t, "host spark: port", "ok", "")
	kv := rep.find("KV wire to spark/tiny-prefill")
	if len(kv) != 1 || kv[0].Status != "ok" || kv[0].Data["goodput_gbps"] == nil || kv[0].Data["bytes"] != float64(16<<20) {
		t.Fatalf("link probe: %+v", kv)
	}
	t.Logf("mac → spark: %s", kv[0].Detail)

	// 2. A different cluster file on this host.
	other := filepath.Join(dir, "other.toml")
	os.WriteFile(other, []byte(cfg+"# edited here only\n"), 0o644)
	rep, code := doctor(t, exe, "--config", other, "--host", "mac", "--probe-mib", "0")
	if code != 1 || rep.OK {
		t.Errorf("different file: exit %d\n%s", code, rep)
	}
	rep.expect(t, "host spark: cluster file", "fail", "copy this host's "+other+" to spark")

	// 3. A wrong secret on this host: the secret file changed after spark's
	// prefill runner read it.
	os.WriteFile(secret, []byte("wrong secret\n"), 0o600)
	rep, code = doctor(t, exe, "--config", cfgPath, "--host", "mac", "--probe-mib", "0")
	os.WriteFile(secret, []byte("right secret\n"), 0o600)
	if code != 1 {
		t.Errorf("wrong secret: exit %d\n%s", code, rep)
	}
	rep.expect(t, "KV wire to spark/tiny-prefill", "fail", "the secrets differ: copy "+secret+" from spark")
	rep.expect(t, "host spark: cluster file", "ok", "")

	// 4. mac down and its gateway port taken by another program: mac's
	// doctor says the port is taken; spark's says mac's ports are unreachable.
	if _, exited := mac.stop(30 * time.Second); !exited {
		t.Fatal("mac did not stop")
	}
	squat, err := net.Listen("tcp", mac.api)
	if err != nil {
		t.Fatal(err)
	}
	defer squat.Close()
	rep, code = doctor(t, exe, "--config", cfgPath, "--host", "mac", "--probe-mib", "0")
	if code != 1 {
		t.Errorf("port taken: exit %d\n%s", code, rep)
	}
	rep.expect(t, "(API gateway)", "fail", "is taken: find the process with `ss -ltnp")
	rep.expect(t, "(model tiny decode)", "ok", "")

	rep, code = doctor(t, exe, "--config", cfgPath, "--host", "spark", "--probe-mib", "0")
	if code != 1 {
		t.Errorf("mac down: exit %d\n%s", code, rep)
	}
	rep.expect(t, "host mac: port", "fail", "open TCP")
	rep.expect(t, "host mac", "fail", "")
	rep.expect(t, "KV wire to spark/tiny-prefill", "ok", "")
}
