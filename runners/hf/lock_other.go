//go:build !unix

package hf

import (
	"context"
	"errors"
)

// lockFile is unavailable off Unix: exo's hosts are Linux and macOS.
func lockFile(ctx context.Context, path string) (func(), error) {
	return nil, errors.New("hf: store locking needs a Unix system")
}
