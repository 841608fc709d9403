package main

import "context"

// cmdStatus is a placeholder until its owner lands it.
func cmdStatus(ctx context.Context, args []string) error { return errNotYet }
