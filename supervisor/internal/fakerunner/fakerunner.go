// Package fakerunner turns a test binary into a stand-in for `exo runner`:
// a TestMain calls MaybeRun, and when the supervisor under test re-executes
// the binary with EXO_FAKE_RUNNER=1 it becomes a child process that parses
// the real runner command line (--listen, --metrics, --served-name) and
// serves /health, /metrics and a tiny OpenAI chat endpoint — or exits with a
// code, crashes, ignores SIGTERM or forks a grandchild, as EXO_FAKE_MODE says.
// Only tests import it; it must not import runners/.
package fakerunner

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Environment variables.
const (
	EnvEnable        = "EXO_FAKE_RUNNER"         // "1" → act as a runner
	EnvMode          = "EXO_FAKE_MODE"           // see MaybeRun
	EnvGrandchildPID = "EXO_FAKE_GRANDCHILD_PID" // file for the grandchild's PID
	EnvModeFor       = "EXO_FAKE_MODE_"          // + served name + "_" + role: per-runner mode override
	EnvListenDelay   = "EXO_FAKE_LISTEN_DELAY"   // a duration to wait before listening (a slow-loading runner)
	EnvArgsFile      = "EXO_FAKE_ARGS_FILE"      // a file the runner writes its arguments to (JSON), first thing
)

// MaybeRun becomes a fake runner and never returns when EXO_FAKE_RUNNER=1.
// Modes (EXO_FAKE_MODE, or EXO_FAKE_MODE_<name>_<role> for one runner):
//
//	serve        serve /health 200 until SIGTERM (default)
//	loading      serve /health 503 {"status":"loading","progress":0.5}
//	exit:N       exit with status N at once
//	fail:MSG     print "exo: MSG" on stderr (as exo does) and exit 1
//	crash        die by SIGKILL at once
//	ignore-term  ignore SIGTERM and serve
//	grandchild   fork a grandchild in mode sleep, then serve
//	sleep        ignore SIGTERM, write the PID to $EXO_FAKE_GRANDCHILD_PID
//	             when set, and sleep (the grandchild)
//
// /health echoes --instance as "instance" and the PID as "pid", as exo
// runners do.
func MaybeRun() {
	if os.Getenv(EnvEnable) != "1" {
		return
	}
	os.Exit(run(os.Args[1:]))
}

func flagValue(args []string, name string) string {
	for i, a := range args {
		if a == name && i+1 < len(args) {
			return args[i+1]
		}
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v
		}
	}
	return ""
}

func run(args []string) int {
	role, served := "", flagValue(args, "--served-name")
	if len(args) >= 2 && args[0] == "runner" {
		role = args[1]
	}
	addr := flagValue(args, "--metrics")
	if addr == "" {
		addr = flagValue(args, "--listen")
	}
	mode := os.Getenv(EnvMode)
	if m := os.Getenv(EnvModeFor + strings.NewReplacer("-", "_", ".", "_").Replace(served) + "_" + role); m != "" {
		mode = m
	}
	if mode == "" {
		mode = "serve"
	}
	if f := os.Getenv(EnvArgsFile); f != "" {
		b, _ := json.Marshal(args)
		if err := os.WriteFile(f, b, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "write args:", err)
			return 1
		}
	}
	fmt.Printf("fake runner %s %s pid %d mode %s on %s\n", served, role, os.Getpid(), mode, addr)
	fmt.Fprintln(os.Stderr, "a line on stderr")
	switch {
	case strings.HasPrefix(mode, "fail:"):
		fmt.Fprintln(os.Stderr, "exo:", strings.TrimPrefix(mode, "fail:"))
		return 1
	case strings.HasPrefix(mode, "exit:"):
		n, _ := strconv.Atoi(strings.TrimPrefix(mode, "exit:"))
		return n
	case mode == "crash":
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		time.Sleep(time.Hour)
	case mode == "sleep":
		signal.Ignore(syscall.SIGTERM)
		if f := os.Getenv(EnvGrandchildPID); f != "" { // written once SIGTERM is ignored
			os.WriteFile(f, []byte(strconv.Itoa(os.Getpid())), 0o644)
		}
		time.Sleep(time.Hour)
		return 0
	case mode == "ignore-term":
		signal.Ignore(syscall.SIGTERM)
	case mode == "grandchild":
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), EnvMode+"=sleep", EnvModeFor+strings.NewReplacer("-", "_", ".", "_").Replace(served)+"_"+role+"=sleep")
		if err := cmd.Start(); err != nil {
			fmt.Fprintln(os.Stderr, "fork grandchild:", err)
			return 1
		}
	}
	if addr == "" {
		time.Sleep(time.Hour)
		return 0
	}
	if d, err := time.ParseDuration(os.Getenv(EnvListenDelay)); err == nil {
		time.Sleep(d)
	}
	instance := flagValue(args, "--instance")
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if mode == "loading" {
			w.WriteHeader(http.StatusServiceUnavailable)
			json.NewEncoder(w).Encode(map[string]any{"status": "loading", "progress": 0.5, "instance": instance, "pid": os.Getpid()})
			return
		}
		json.NewEncoder(w).Encode(map[string]any{"status": "ok", "role": role, "model": served, "waiting": 0, "running": 0,
			"instance": instance, "pid": os.Getpid()})
	})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "# HELP exo_requests_waiting Requests waiting.\n# TYPE exo_requests_waiting gauge\nexo_requests_waiting{role=%q} 0\n", role)
	})
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"object":"chat.completion","model":%q,"served_by":%q,"choices":[{"index":0,"message":{"role":"assistant","content":"hi from %d"}}]}`, served, addr, os.Getpid())
	})
	if err := http.ListenAndServe(addr, mux); err != nil {
		fmt.Fprintln(os.Stderr, "fake runner:", err)
		return 1
	}
	return 0
}
