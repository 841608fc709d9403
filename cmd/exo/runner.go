package main

import "context"

// cmdRunner is a placeholder until its owner lands it.
func cmdRunner(ctx context.Context, args []string) error { return errNotYet }
