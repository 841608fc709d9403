// Package imports holds no code: its test enforces the module's import
// rules (supervisor/ never imports runners/, runners/ never imports
// supervisor/, nothing outside cmd/ imports cmd/), over every Go file,
// tests included.
package imports
