package runner

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestRunRefusesBeforeLoading: Run's refusals that come before any model
// is touched: settings that do not go together (Check), an empty secret file names the file, and a taken HTTP port
// (--listen for decode, --metrics for prefill) says it is taken and which
// cluster settings choose it, wrapping EADDRINUSE.
func TestRunRefusesBeforeLoading(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	empty := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(empty, []byte(" \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		base  Config
		edit  func(*Config)
		want  string
		inUse bool
	}{
		{"unchecked settings", decodeConfig(), func(c *Config) { c.ConnectTimeout = 0 }, "runner: --prefill-connect-timeout must be positive", false},
		{"empty secret", decodeConfig(), func(c *Config) { c.Listen, c.SecretFile = "127.0.0.1:0", empty }, "secret file " + empty + " is empty", false},
		{"missing secret", decodeConfig(), func(c *Config) { c.Listen, c.SecretFile = "127.0.0.1:0", empty+".no" }, "runner: secret:", false},
		{"decode port taken", decodeConfig(), func(c *Config) { c.Listen = taken.Addr().String() }, "is taken", true},
		{"prefill metrics port taken", prefillConfig(), func(c *Config) {
			c.Listen, c.MetricsAddr = "127.0.0.1:0", taken.Addr().String()
		}, "is taken", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := c.base
			cfg.Model = "builtin:none"
			c.edit(&cfg)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			err := Run(ctx, cfg, slog.New(slog.DiscardHandler))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Run: %v, want an error saying %q", err, c.want)
			}
			if inUse := errors.Is(err, syscall.EADDRINUSE); inUse != c.inUse {
				t.Fatalf("Run: %v: EADDRINUSE %v, want %v", err, inUse, c.inUse)
			}
			if c.inUse && !strings.Contains(err.Error(), "runner_port_base") {
				t.Fatalf("Run: %v does not name the cluster settings that choose the port", err)
			}
		})
	}
}

// TestRunModelMissing: a model that does not resolve fails Run with the
// source named, after the HTTP server it started has shut down (its port
// is free again).
func TestRunModelMissing(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	src := filepath.Join(t.TempDir(), "absent")
	cfg := decodeConfig()
	cfg.Model, cfg.Listen, cfg.Backend, cfg.Offline = src, addr, "cpu", true
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = Run(ctx, cfg, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "runner: model "+src+":") {
		t.Fatalf("Run: %v, want the missing model named", err)
	}
	again, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("the runner's port after Run returned: %v", err)
	}
	again.Close()
}

// TestSplitList: empty items and spaces are dropped, order is kept.
func TestSplitList(t *testing.T) {
	for in, want := range map[string]string{"": "", "a": "a", " a , ,b,": "a|b", ",,": ""} {
		if got := strings.Join(SplitList(in), "|"); got != want {
			t.Errorf("SplitList(%q) = %q, want %q", in, got, want)
		}
	}
}
