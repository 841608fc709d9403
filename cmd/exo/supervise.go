package main

import "context"

// cmdSupervise is a placeholder until its owner lands it.
func cmdSupervise(ctx context.Context, args []string) error { return errNotYet }
