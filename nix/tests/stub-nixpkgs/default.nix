# Stand-in for `import nixpkgs { system = …; }` in nix/tests/flake-eval.nix:
# nixpkgs' real lib (from $EXO_NIXPKGS_LIB) with stand-in packages.
{ system, ... }:
(import ../flake-eval.nix { lib = import (builtins.getEnv "EXO_NIXPKGS_LIB"); }).pkgsFor system
