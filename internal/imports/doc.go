// Package imports holds no code: its test enforces the module's import
// rules (supervisor/ never imports runners/, runners/ never imports
// supervisor/, nothing outside cmd/ imports cmd/, only tests import test
// support such as runners/kvwire/kvwiretest), over every Go file, tests
// included.
package imports
