package main

import "context"

// cmdModel is a placeholder until its owner lands it.
func cmdModel(ctx context.Context, args []string) error { return errNotYet }
