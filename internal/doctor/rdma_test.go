package doctor

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/exo-pd/exo-pd/supervisor/config"
)

const jacclCluster = `[cluster]
insecure = true

[hosts.m1]
address = "10.0.0.1"
backend = "metal"
rdma = { m2 = "rdma_en3", m3 = "rdma_en4" }

[hosts.m2]
address = "10.0.0.2"
backend = "metal"
rdma = { m1 = "rdma_en3", m3 = "rdma_en5" }

[hosts.m3]
address = "10.0.0.3"
backend = "metal"
rdma = { m1 = "rdma_en4", m2 = "rdma_en5" }

[[models]]
name = "m"
source = "org/m"
decode = { hosts = ["m1", "m2", "m3"], shard = "tensor" }
`

// fixtures answers commands from testdata/rdma: files[cmd] names the
// fixture ("" = the command is not installed).
func fixtures(t *testing.T, files map[string]string) func(context.Context, string, ...string) ([]byte, error) {
	return func(_ context.Context, name string, args ...string) ([]byte, error) {
		cmd := strings.Join(append([]string{name}, args...), " ")
		f, ok := files[cmd]
		if !ok {
			return nil, fmt.Errorf("unexpected command %q", cmd)
		}
		if f == "" {
			return nil, &exec.Error{Name: name, Err: exec.ErrNotFound}
		}
		return os.ReadFile(filepath.Join("testdata", "rdma", f))
	}
}

func TestRDMA(t *testing.T) {
	c, err := config.Parse("f.toml", []byte(jacclCluster))
	if err != nil {
		t.Fatal(err)
	}
	env := &Env{Config: c, Host: "m1"}
	ok := map[string]string{
		"rdma_ctl status":         "rdma_ctl_enabled.txt",
		"ibv_devices":             "ibv_devices.txt",
		"ibv_devinfo -d rdma_en3": "ibv_devinfo_active.txt",
		"ibv_devinfo -d rdma_en4": "ibv_devinfo_active.txt",
	}
	summary := func(rs []Result) []string {
		var out []string
		for _, r := range rs {
			out = append(out, r.Status+" "+r.Name+": "+r.Detail)
		}
		return out
	}
	// A full mesh, cabled: every device present and active.
	rs := RDMA{GOOS: "darwin", Output: fixtures(t, ok)}.Run(context.Background(), env)
	want := []string{
		"ok rdma: RDMA enabled (rdma_ctl status)",
		"ok rdma m-decode-rank0 → m2 (rdma_en3): rdma_en3 present, port active",
		"ok rdma m-decode-rank0 → m3 (rdma_en4): rdma_en4 present, port active",
	}
	if got := summary(rs); !slices.Equal(got, want) {
		t.Fatalf("cabled mesh:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// The cable toward m3 is out.
	down := map[string]string{}
	for k, v := range ok {
		down[k] = v
	}
	down["ibv_devinfo -d rdma_en4"] = "ibv_devinfo_down.txt"
	rs = RDMA{GOOS: "darwin", Output: fixtures(t, down)}.Run(context.Background(), env)
	if len(rs) != 3 || rs[2].Status != Fail || !strings.Contains(rs[2].Detail, "rdma_en4 is PORT_DOWN") || !strings.Contains(rs[2].Fix, "to m3") {
		t.Fatalf("port down: %v", summary(rs))
	}
	// m2 names a device this Mac does not have (rdma_en5 on m2).
	env2 := &Env{Config: c, Host: "m2"}
	rs = RDMA{GOOS: "darwin", Output: fixtures(t, ok)}.Run(context.Background(), env2)
	if len(rs) != 3 || rs[1].Status != OK || rs[2].Status != Fail || !strings.Contains(rs[2].Detail, "no device rdma_en5 here (ibv_devices lists: rdma_en2, rdma_en3, rdma_en4)") {
		t.Fatalf("missing device: %v", summary(rs))
	}
	// RDMA off: one failure saying how to enable it.
	off := map[string]string{"rdma_ctl status": "rdma_ctl_disabled.txt"}
	rs = RDMA{GOOS: "darwin", Output: fixtures(t, off)}.Run(context.Background(), env)
	if len(rs) != 1 || rs[0].Status != Fail || !strings.Contains(rs[0].Fix, "rdma_ctl enable") {
		t.Fatalf("disabled: %v", rs)
	}
	// macOS before 26.2: no rdma_ctl.
	rs = RDMA{GOOS: "darwin", Output: fixtures(t, map[string]string{"rdma_ctl status": ""})}.Run(context.Background(), env)
	if len(rs) != 1 || rs[0].Status != Fail || !strings.Contains(rs[0].Detail, "26.2") {
		t.Fatalf("no rdma_ctl: %v", rs)
	}
	// Elsewhere: skipped with the reason, nothing run.
	rs = RDMA{GOOS: "linux", Output: fixtures(t, nil)}.Run(context.Background(), env)
	if len(rs) != 1 || rs[0].Status != Skip || !strings.Contains(rs[0].Detail, "this host is linux") {
		t.Fatalf("linux: %v", rs)
	}
	// No JACCL group on this host: nothing to say.
	c2, err := config.Parse("f.toml", []byte(strings.ReplaceAll(jacclCluster, `shard = "tensor"`, `shard = "replicas"`)))
	if err != nil {
		t.Fatal(err)
	}
	if rs = (RDMA{GOOS: "darwin", Output: fixtures(t, nil)}).Run(context.Background(), &Env{Config: c2, Host: "m1"}); len(rs) != 0 {
		t.Fatalf("no tensor group: %v", rs)
	}
}

// FuzzRDMAParsers: the parsers of the tools' output never panic.
func FuzzRDMAParsers(f *testing.F) {
	for _, n := range []string{"ibv_devices.txt", "ibv_devinfo_active.txt", "rdma_ctl_enabled.txt"} {
		b, _ := os.ReadFile(filepath.Join("testdata", "rdma", n))
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, d := range parseIBVDevices(b) {
			if d == "" {
				t.Fatal("empty device name")
			}
		}
		_ = portState(b)
		_ = rdmaEnabled(b)
	})
}
