{
  description = "exo-pd: disaggregated LLM serving, prefill on NVIDIA (MLX CUDA), decode on Apple Silicon (MLX Metal)";

  # flake.lock pins nixpkgs by revision. MLX comes from its PyPI release
  # wheels (URL + sha256 in nix/mlx-wheels.json), mlx-c from GitHub by commit
  # and NAR hash (nix/mlx-c.nix): no other inputs.
  inputs = {
    nixpkgs.url = "github:NixOS/nixpkgs/nixos-unstable";
  };

  outputs =
    {
      self,
      nixpkgs,
    }:
    let
      systems = [
        "aarch64-darwin"
        "aarch64-linux"
        "x86_64-linux"
      ];
      forAllSystems = f: nixpkgs.lib.genAttrs systems (system: f system);

      version = "0.1.0+${self.shortRev or self.dirtyShortRev or "dirty"}";

      # CUDA is unfree (the wheel's libmlx links cuBLAS, NVRTC, cuDNN, NCCL).
      pkgsFor =
        system:
        import nixpkgs {
          inherit system;
          config.allowUnfree = true;
        };

      packagesFor =
        system:
        let
          pkgs = pkgsFor system;
          darwin = pkgs.stdenv.hostPlatform.isDarwin;
          # mlx-cuda-13 0.31.1 is built against CUDA 13.0.
          cudaPackages =
            pkgs.cudaPackages_13_0 or (throw "this nixpkgs has no cudaPackages_13_0 (mlx-cuda-13 needs CUDA 13)");

          # MLX 0.31.1 from PyPI's release wheels (the default).
          mlxWheel =
            backend:
            pkgs.callPackage ./nix/mlx-wheel.nix (
              { inherit backend; } // pkgs.lib.optionalAttrs (backend == "cuda") { inherit cudaPackages; }
            );
          exoWith =
            mlx-c:
            pkgs.callPackage ./nix/package.nix {
              inherit mlx-c version;
              buildGoModule = pkgs.buildGo126Module;
              src = self;
            };

          mlx = mlxWheel (if darwin then "metal" else "cuda");
          mlx-cpu = mlxWheel "cpu";
          mlx-c = pkgs.callPackage ./nix/mlx-c.nix { inherit mlx; };
          mlx-c-cpu = pkgs.callPackage ./nix/mlx-c.nix { mlx = mlx-cpu; };

          # MLX v0.31.2 built from source (CPU backend; nix/mlx.nix also
          # builds Metal and CUDA given the sources MLX's CMake would
          # download, see docs/NIX.md), with mlx-c fba4470b.
          mlx-src-cpu = pkgs.callPackage ./nix/mlx.nix { backend = "cpu"; };
          mlx-c-src-cpu = pkgs.callPackage ./nix/mlx-c.nix { mlx = mlx-src-cpu; };
        in
        {
          inherit
            mlx
            mlx-cpu
            mlx-c
            mlx-c-cpu
            mlx-src-cpu
            mlx-c-src-cpu
            ;
          # exo with MLX (Metal on the Macs, CUDA on Linux): the deployment build.
          exo = exoWith mlx-c;
          # exo with MLX's CPU backend: for machines without a GPU.
          exo-cpu = exoWith mlx-c-cpu;
          # exo with MLX v0.31.2 built from source (CPU backend).
          exo-src-cpu = exoWith mlx-c-src-cpu;
          # exo alone: the pure-Go CPU backend, no MLX at all (cheap to build).
          exo-go = exoWith null;
          default = self.packages.${system}.exo;
        };
    in
    {
      packages = forAllSystems packagesFor;

      apps = forAllSystems (system: {
        exo = {
          type = "app";
          program = "${self.packages.${system}.exo}/bin/exo";
        };
        default = self.apps.${system}.exo;
      });

      nixosModules.default = import ./nix/nixos-module.nix { inherit self; };
      darwinModules.default = import ./nix/darwin-module.nix { inherit self; };

      checks = forAllSystems (
        system:
        let
          pkgs = pkgsFor system;
          inherit (pkgs) lib;
          exo-go = self.packages.${system}.exo-go;
          smollm2 = pkgs.callPackage ./nix/smollm2.nix { };
          evaluated = import ./nix/tests/eval.nix;
        in
        {
          # Every Go test, offline, on the vendored modules of the package
          # (tests that need Python reference packages skip without them).
          go-tests = pkgs.stdenv.mkDerivation {
            name = "exo-go-tests";
            src = self;
            nativeBuildInputs = [
              exo-go.go
              pkgs.python3
            ];
            env.EXO_SMOLLM2_GGUF = "${smollm2}/${smollm2.file}";
            buildPhase = ''
              runHook preBuild
              export HOME=$TMPDIR GOCACHE=$TMPDIR/go-cache GOFLAGS=-mod=vendor GOTOOLCHAIN=local GOPROXY=off
              cp -r --no-preserve=mode ${exo-go.goModules} vendor
              go test -count=1 ./...
              runHook postBuild
            '';
            installPhase = "touch $out";
          };

          # The example cluster file and the VM test's settings pass `exo config check`.
          config-check = pkgs.runCommand "exo-config-check" { nativeBuildInputs = [ exo-go ]; } ''
            exo config check ${./etc/exo/cluster.example.toml}
            touch $out
          '';

          # The pure helpers render what the committed fixtures say (the same
          # comparison nix/tests/check.sh makes in CI without a store).
          nix-lib = pkgs.runCommand "exo-nix-lib" { } (
            lib.concatMapStrings (name: ''
              diff -u ${./nix/tests/fixtures + "/${name}"} ${builtins.toFile name evaluated.${name}}
            '') (builtins.attrNames evaluated)
            + "touch $out\n"
          );
        }
        // lib.optionalAttrs pkgs.stdenv.hostPlatform.isLinux {
          # A one-host cluster on the CPU backend in a NixOS VM.
          vm = import ./nix/tests/vm.nix {
            inherit pkgs;
            module = self.nixosModules.default;
            package = exo-go;
          };
        }
      );

      devShells = forAllSystems (
        system:
        let
          pkgs = pkgsFor system;
        in
        {
          default = pkgs.mkShell {
            # mlx-c's build inputs (compilers, cmake, the MLX wheel) for
            # working on the MLX backend against a local mlx-c build.
            inputsFrom = [ self.packages.${system}.mlx-c-cpu ];
            packages = [
              self.packages.${system}.exo-go.go
              pkgs.gopls
              pkgs.gotools
              pkgs.go-tools
              pkgs.cmake
              pkgs.ninja
              pkgs.python3
            ];
            # For the MLX backend: nix build .#mlx-c-cpu (or .#mlx-c), then
            # export EXO_MLXC_PATH=$PWD/result/lib
          };
        }
      );
    };
}
