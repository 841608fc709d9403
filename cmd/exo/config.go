package main

import "context"

// cmdConfig is a placeholder until its owner lands it.
func cmdConfig(ctx context.Context, args []string) error { return errNotYet }
