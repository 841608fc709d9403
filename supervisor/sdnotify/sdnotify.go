// Package sdnotify owns the supervisor's conversation with systemd
// (sd_notify over $NOTIFY_SOCKET, via go-systemd): READY, RELOADING with
// MONOTONIC_USEC, STOPPING, STATUS and WATCHDOG at half of WatchdogSec. When
// NOTIFY_SOCKET is unset (macOS, a terminal, tests) every call is a silent
// no-op, so callers never branch on the platform. It must not import other
// supervisor packages.
package sdnotify

import (
	"context"
	"log/slog"
	"strings"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
)

// Notifier sends state changes to systemd.
type Notifier struct {
	log *slog.Logger
}

// New returns a Notifier; log receives send errors (nil = slog.Default()).
func New(log *slog.Logger) *Notifier {
	if log == nil {
		log = slog.Default()
	}
	return &Notifier{log: log}
}

func (n *Notifier) send(lines ...string) {
	if _, err := daemon.SdNotify(false, strings.Join(lines, "\n")); err != nil {
		n.log.Warn("sd_notify failed", "err", err)
	}
}

// oneLine makes status safe for STATUS= (a single line).
func oneLine(status string) string {
	return strings.Join(strings.Fields(status), " ")
}

// Ready says the service is up (startup done, or a reload finished).
func (n *Notifier) Ready(status string) {
	n.send(daemon.SdNotifyReady, "STATUS="+oneLine(status))
}

// Reloading says a configuration reload has started.
func (n *Notifier) Reloading() {
	n.send(daemon.SdNotifyReloading, strings.TrimSuffix(daemon.SdNotifyMonotonicUsec(), "\n"))
}

// Stopping says the service is shutting down.
func (n *Notifier) Stopping() { n.send(daemon.SdNotifyStopping) }

// Status sets the one-line status systemctl shows.
func (n *Notifier) Status(status string) { n.send("STATUS=" + oneLine(status)) }

// ExtendTimeout asks systemd to wait d longer for READY (model downloads).
func (n *Notifier) ExtendTimeout(d time.Duration) {
	n.send("EXTEND_TIMEOUT_USEC=" + itoa(d.Microseconds()))
}

func itoa(v int64) string {
	var b [20]byte
	i := len(b)
	if v == 0 {
		return "0"
	}
	for v > 0 {
		i--
		b[i] = byte('0' + v%10)
		v /= 10
	}
	return string(b[i:])
}

// WatchdogInterval is half of the service's WatchdogSec, or 0 when systemd
// expects no watchdog pings.
func WatchdogInterval() time.Duration {
	d, err := daemon.SdWatchdogEnabled(false)
	if err != nil || d <= 0 {
		return 0
	}
	return d / 2
}

// RunWatchdog sends WATCHDOG=1 every WatchdogInterval while alive() holds,
// until ctx ends. alive lets the caller withhold pings when its main loop is
// stuck, so systemd restarts it. It returns at once without a watchdog.
func (n *Notifier) RunWatchdog(ctx context.Context, alive func() bool) {
	every := WatchdogInterval()
	if every <= 0 {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if alive == nil || alive() {
			n.send(daemon.SdNotifyWatchdog)
		} else {
			n.log.Error("main loop unresponsive; withholding the watchdog ping")
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
