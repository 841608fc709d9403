package main

import "context"

// cmdBench is a placeholder until its owner lands it.
func cmdBench(ctx context.Context, args []string) error { return errNotYet }
