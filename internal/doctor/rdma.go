package doctor

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"runtime"
	"slices"
	"strings"
)

// RDMA checks what MLX's JACCL backend needs on this host for each of its
// tensor-parallel ranks whose group joins JACCL (the runner has
// --tensor-rdma: metal hosts naming [hosts.X] rdma devices): RDMA enabled
// (`rdma_ctl status`), and toward every other host of the group the named
// device present (`ibv_devices`) with its port active (`ibv_devinfo -d`:
// a Thunderbolt 5 cable plugged in and up). That every pair is named is
// the cluster file's own check (a full mesh); which Mac a cable reaches
// is not visible here. Elsewhere than macOS the check is skipped.
type RDMA struct {
	// GOOS is the host's OS ("": runtime.GOOS).
	GOOS string
	// Output runs a command and returns its standard output (nil: exec).
	Output func(ctx context.Context, name string, args ...string) ([]byte, error)
}

func (RDMA) Name() string { return "rdma" }

func (k RDMA) Run(ctx context.Context, d *Env) []Result {
	type group struct {
		runner string
		peers  []string // the group's other hosts, in rank order
	}
	var groups []group
	for _, r := range d.Config.Runners(d.Host) {
		if r.TensorRDMA == "" {
			continue
		}
		m := d.Config.Model(r.Model)
		if m == nil || m.Decode == nil {
			continue
		}
		g := group{runner: r.Name}
		for _, h := range m.Decode.Hosts {
			if h != d.Host {
				g.peers = append(g.peers, h)
			}
		}
		groups = append(groups, g)
	}
	if len(groups) == 0 {
		return nil
	}
	goos := k.GOOS
	if goos == "" {
		goos = runtime.GOOS
	}
	if goos != "darwin" {
		return []Result{{Name: "rdma", Status: Skip, Detail: fmt.Sprintf("JACCL (RDMA over Thunderbolt 5) runs on macOS; this host is %s, so its tensor ranks will use MLX's ring", goos)}}
	}
	out := k.Output
	if out == nil {
		out = func(ctx context.Context, name string, args ...string) ([]byte, error) {
			return exec.CommandContext(ctx, name, args...).Output()
		}
	}
	var rs []Result
	st, err := out(ctx, "rdma_ctl", "status")
	switch {
	case errors.Is(err, exec.ErrNotFound):
		return []Result{{Name: "rdma", Status: Fail, Detail: "rdma_ctl not found: RDMA over Thunderbolt needs macOS 26.2 or later",
			Fix: "update macOS to 26.2+, then enable RDMA from Recovery (docs/OPERATIONS.md \"Tensor groups on Macs: JACCL\")"}}
	case err != nil:
		return []Result{{Name: "rdma", Status: Fail, Detail: "rdma_ctl status: " + err.Error(),
			Fix: "run `rdma_ctl status` by hand; RDMA over Thunderbolt needs macOS 26.2 or later"}}
	case !rdmaEnabled(st):
		return []Result{{Name: "rdma", Status: Fail, Detail: fmt.Sprintf("RDMA is not enabled (rdma_ctl status: %q): JACCL cannot start", strings.TrimSpace(string(st))),
			Fix: "boot into macOS Recovery, open Terminal, run `rdma_ctl enable`, reboot"}}
	}
	rs = append(rs, Result{Name: "rdma", Status: OK, Detail: "RDMA enabled (rdma_ctl status)"})
	lst, err := out(ctx, "ibv_devices")
	if err != nil {
		return append(rs, Result{Name: "rdma devices", Status: Fail, Detail: "ibv_devices: " + err.Error(),
			Fix: "run `ibv_devices` by hand: it lists the Thunderbolt RDMA devices JACCL uses"})
	}
	have := parseIBVDevices(lst)
	me := d.Config.Hosts[d.Host]
	for _, g := range groups {
		for _, peer := range g.peers {
			dev := me.RDMA[peer]
			name := fmt.Sprintf("rdma %s → %s (%s)", g.runner, peer, dev)
			if !slices.Contains(have, dev) {
				rs = append(rs, Result{Name: name, Status: Fail, Detail: fmt.Sprintf("no device %s here (ibv_devices lists: %s)", dev, strings.Join(have, ", ")),
					Fix: fmt.Sprintf("fix [hosts.%s] rdma's %s entry to the device cabled to %s (JACCL needs a Thunderbolt 5 cable between every pair of Macs)", d.Host, peer, peer)})
				continue
			}
			info, err := out(ctx, "ibv_devinfo", "-d", dev)
			if err != nil {
				rs = append(rs, Result{Name: name, Status: Fail, Detail: "ibv_devinfo: " + err.Error(), Fix: "run `ibv_devinfo -d " + dev + "` by hand"})
				continue
			}
			if state := portState(info); state != "PORT_ACTIVE" {
				if state == "" {
					state = "no port state"
				}
				rs = append(rs, Result{Name: name, Status: Fail, Detail: fmt.Sprintf("%s is %s: no live cable in that port", dev, state),
					Fix: fmt.Sprintf("plug a Thunderbolt 5 cable from that port to %s (or name the port that has it in [hosts.%s] rdma)", peer, d.Host)})
				continue
			}
			rs = append(rs, Result{Name: name, Status: OK, Detail: dev + " present, port active"})
		}
	}
	return rs
}

// rdmaEnabled reads `rdma_ctl status`: it prints whether RDMA is
// enabled or disabled.
func rdmaEnabled(out []byte) bool {
	s := strings.ToLower(string(out))
	return strings.Contains(s, "enabled") && !strings.Contains(s, "disabled")
}

// parseIBVDevices reads `ibv_devices`: a header ("device  node GUID"), a
// rule of dashes, then one "NAME GUID" line per device.
func parseIBVDevices(out []byte) []string {
	var devs []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 || f[0] == "device" || strings.HasPrefix(f[0], "-") {
			continue
		}
		devs = append(devs, f[0])
	}
	return devs
}

// portState reads `ibv_devinfo -d DEV`'s first port's state
// ("PORT_ACTIVE", "PORT_DOWN", …; "" when there is none).
func portState(out []byte) string {
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		if ok && strings.TrimSpace(k) == "state" {
			if f := strings.Fields(v); len(f) > 0 {
				return f[0]
			}
		}
	}
	return ""
}
