package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestMain lets the tests run this binary as exo itself.
func TestMain(m *testing.M) {
	if os.Getenv("EXO_TEST_AS_EXO") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// exo runs this test binary as `exo args…`.
func exo(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "EXO_TEST_AS_EXO=1")
	var o, e strings.Builder
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	code = 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return o.String(), e.String(), code
}

// TestEverySubcommandAnswersHelp: each subcommand answers --help (and -h)
// with its usage and flags on stdout and exits 0, without doing anything.
func TestEverySubcommandAnswersHelp(t *testing.T) {
	want := map[string][]string{ // what the help must mention (flags)
		"supervise":      {"--listen", "--config", "--default", "--host"},
		"runner":         {"decode", "prefill", "--served-name", "--instance"},
		"runner decode":  {"-default-temperature", "-instance", "-max-batch"},
		"runner prefill": {"-metrics", "-prefix-cache-mib"},
		"config":         {"check", "default"},
		"config check":   {"check"},
		"run":            {"-model", "-temperature", "-seed", "/bye"},
		"bench":          {"-url", "-pp", "-concurrency"},
		"model":          {"pull", "list", "rm"},
		"model pull":     {"-models-dir", "-offline", "-layers", "GGUF file, are fetched whole"},
		"status":         {"-api", "-json"},
		"version":        {"usage: exo version"},
		"doctor":         {"-config", "-probe-mib", "-json"},
	}
	for name := range commands() {
		if _, ok := want[name]; !ok {
			t.Errorf("subcommand %q has no --help case here", name)
		}
	}
	if out, _, code := exo(t, "--help"); code != 0 || !strings.Contains(out, "supervise") || !strings.Contains(out, "--help") {
		t.Errorf("exo --help: exit %d:\n%s", code, out)
	}
	for cmd, mentions := range want {
		for _, h := range []string{"--help", "-h"} {
			args := append(strings.Fields(cmd), h)
			out, errOut, code := exo(t, args...)
			if code != 0 {
				t.Errorf("exo %s: exit %d, stderr %s", strings.Join(args, " "), code, errOut)
				continue
			}
			for _, m := range mentions {
				if !strings.Contains(out, m) {
					t.Errorf("exo %s: stdout lacks %q:\n%s", strings.Join(args, " "), m, out)
				}
			}
		}
	}
}

func TestBadFlagIsAUsageError(t *testing.T) {
	for _, cmd := range []string{"supervise", "run", "bench", "status", "model list", "runner decode"} {
		args := append(strings.Fields(cmd), "--no-such-flag")
		_, errOut, code := exo(t, args...)
		if code != 2 || !strings.Contains(errOut, "no-such-flag") {
			t.Errorf("exo %s: exit %d, stderr %q", strings.Join(args, " "), code, errOut)
		}
	}
}
