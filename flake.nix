{
  description = "exo-pd: disaggregated LLM serving, prefill on NVIDIA (MLX CUDA), decode on Apple Silicon (MLX Metal)";

  # No flake.lock is committed: it could not be computed where this flake was
  # written (no Nix store, no network to nixpkgs). `nix flake lock` (or the
  # first `nix build`) pins every input below and records its hash; commit
  # that flake.lock. MLX and mlx-c themselves are pinned by commit and NAR
  # hash in nix/mlx.nix and nix/mlx-c.nix.
  inputs = {
    nixpkgs.url = "github:NixOS/nixpkgs/nixos-unstable";

    # MLX v0.31.2's build-time sources that its CMake would download; the
    # exact versions that release names (CMakeLists.txt, backend/cuda).
    cccl = {
      url = "https://github.com/NVIDIA/cccl/releases/download/v3.1.3/cccl-v3.1.3.zip";
      flake = false;
    };
    nvtx = {
      url = "github:NVIDIA/NVTX/v3.1.1";
      flake = false;
    };
    cutlass = {
      url = "github:NVIDIA/cutlass/v4.4.2";
      flake = false;
    };
    metal-cpp = {
      url = "https://developer.apple.com/metal/cpp/files/metal-cpp_26.zip";
      flake = false;
    };
  };

  outputs =
    {
      self,
      nixpkgs,
      cccl,
      nvtx,
      cutlass,
      metal-cpp,
    }:
    let
      systems = [
        "aarch64-darwin"
        "aarch64-linux"
        "x86_64-linux"
      ];
      forAllSystems = f: nixpkgs.lib.genAttrs systems (system: f system);

      version = "0.1.0+${self.shortRev or self.dirtyShortRev or "dirty"}";

      # CUDA is unfree; MLX v0.31.2 refuses CUDA 13.1, so 13.0 is pinned.
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
          inherit (pkgs) lib;
          darwin = pkgs.stdenv.hostPlatform.isDarwin;
          cudaPackages =
            pkgs.cudaPackages_13_0 or (throw "this nixpkgs has no cudaPackages_13_0 (MLX v0.31.2 needs CUDA 13.0)");

          mlxWith =
            backend:
            pkgs.callPackage ./nix/mlx.nix (
              {
                inherit backend;
              }
              // lib.optionalAttrs (backend == "cuda") {
                inherit cudaPackages;
                cccl-src = cccl;
                nvtx-src = nvtx;
                cutlass-src = cutlass;
              }
              // lib.optionalAttrs (backend == "metal") {
                metal-cpp-src = metal-cpp;
              }
            );
          exoWith =
            mlx-c:
            pkgs.callPackage ./nix/package.nix {
              inherit mlx-c version;
              src = self;
            };

          mlx = mlxWith (if darwin then "metal" else "cuda");
          mlx-cpu = mlxWith "cpu";
          mlx-c = pkgs.callPackage ./nix/mlx-c.nix { inherit mlx; };
          mlx-c-cpu = pkgs.callPackage ./nix/mlx-c.nix { mlx = mlx-cpu; };
        in
        {
          inherit
            mlx
            mlx-cpu
            mlx-c
            mlx-c-cpu
            ;
          # exo with MLX (Metal on the Macs, CUDA on Linux): the deployment build.
          exo = exoWith mlx-c;
          # exo with MLX's CPU backend: for machines without a GPU.
          exo-cpu = exoWith mlx-c-cpu;
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
            # MLX's build inputs (compilers, cmake, BLAS or the SDK) for
            # working on the MLX backend against a local mlx-c build.
            inputsFrom = [ self.packages.${system}.mlx-cpu ];
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
