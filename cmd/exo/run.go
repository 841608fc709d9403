package main

import "context"

// cmdRun is a placeholder until its owner lands it.
func cmdRun(ctx context.Context, args []string) error { return errNotYet }
