# Evaluates flake.nix's outputs against a stand-in nixpkgs (nixpkgs' real
# lib, stand-in packages whose derivations just return their attributes), so
# the wiring can be checked where no Nix store and no nixpkgs exist: every
# package's inputs resolve, the assertions in nix/mlx.nix hold, and the build
# flags each platform gets are the ones intended (compared with a fixture).
#   nix-instantiate --eval --strict --json nix/tests/flake-eval.nix --arg lib 'import /path/to/nixpkgs/lib'
# nix/tests/check.sh runs it when EXO_NIXPKGS_LIB names such a lib directory.
{ lib }:
let
  flake = import ../../flake.nix;

  store = name: "/nix/store/00000000000000000000000000000000-${name}";
  pkg = name: {
    type = "derivation";
    inherit name;
    outPath = store name;
    meta = { };
  };

  # A derivation stand-in: the attributes it was given (passthru merged in,
  # as stdenv does), plus a name and path.
  mkDerivation =
    f:
    let
      attrs = if builtins.isFunction f then lib.fix (final: f final) else f;
      name = attrs.name or "${attrs.pname}-${attrs.version}";
    in
    attrs
    // attrs.passthru or { }
    // {
      type = "derivation";
      inherit name;
      outPath = store name;
      meta = attrs.meta or { };
    };

  pkgsFor =
    system:
    let
      darwin = lib.hasSuffix "darwin" system;
      self = {
        inherit lib;
        stdenv = {
          inherit mkDerivation;
          cc = pkg "cc" // { cc = pkg "gcc" // { lib = pkg "gcc-lib"; }; };
          hostPlatform = {
            inherit system;
            isDarwin = darwin;
            isLinux = !darwin;
            extensions.sharedLibrary = if darwin then ".dylib" else ".so";
          };
        };
        callPackage = lib.callPackageWith self;
        fetchFromGitHub =
          { owner, repo, rev, hash }: pkg "github-${owner}-${repo}-${builtins.substring 0 8 rev}" // { inherit rev hash; };
        fetchurl = { url, sha256 }: pkg (baseNameOf url) // { inherit url sha256; };
        runCommand = name: env: script: pkg name // env // env.passthru or { } // { inherit env script; };
        mkShell = args: pkg "shell" // args;
        buildGo126Module =
          args:
          mkDerivation args
          // {
            go = pkg "go";
            goModules = pkg "${args.pname}-${args.version}-go-modules" // { outputHash = args.vendorHash; };
          };
        formats.toml = { }: {
          type = lib.types.attrsOf lib.types.anything;
          generate = name: value: builtins.toFile name (builtins.toJSON value);
        };
        testers.runNixOSTest = t: pkg "nixos-test-${t.name}" // { inherit (t) testScript; };
        nlohmann_json = pkg "nlohmann_json" // { src = pkg "nlohmann_json-src"; };
        cudaPackages_13_0 = lib.genAttrs [
          "cuda_nvcc"
          "cuda_cudart"
          "cuda_cccl"
          "cuda_nvrtc"
          "cuda_nvtx"
          "libcublas"
          "libcufft"
          "cudnn"
          "nccl"
        ] pkg;
      }
      // lib.genAttrs [
        "cmake"
        "ninja"
        "zsh"
        "fmt"
        "openblas"
        "apple-sdk_26"
        "makeBinaryWrapper"
        "python3"
        "gopls"
        "gotools"
        "go-tools"
        "unzip"
        "autoPatchelfHook"
        "addDriverRunpath"
        "curl"
        "jq"
        "coreutils"
      ] pkg;
    in
    self;

  # `import nixpkgs { … }` reads ./stub-nixpkgs (which needs $EXO_NIXPKGS_LIB).
  nixpkgs = {
    inherit lib;
    outPath = ./stub-nixpkgs;
  };
  self = outputs // {
    outPath = ../..;
    shortRev = "abcdef0";
  };
  outputs = flake.outputs {
    inherit self;
    inherit nixpkgs;
  };

  summary =
    system:
    let
      p = outputs.packages.${system};
      c = outputs.checks.${system};
    in
    {
      packages = builtins.attrNames p;
      mlx = {
        inherit (p.mlx) pname version autoPatchelfIgnoreMissingDeps installPhase postFixup;
        src = { inherit (p.mlx.src) url sha256; };
        nativeBuildInputs = map (d: d.name) p.mlx.nativeBuildInputs;
        buildInputs = map (d: d.name) p.mlx.buildInputs;
        inherit (p.mlx.meta) platforms;
      };
      mlx-cpu = { inherit (p.mlx-cpu) pname; src = p.mlx-cpu.src.url; };
      mlx-c = { inherit (p.mlx-c) pname version cmakeFlags postInstall; src = p.mlx-c.src.rev; };
      mlx-c-cpu = { inherit (p.mlx-c-cpu) pname version; };
      mlx-src-cpu = { inherit (p.mlx-src-cpu) pname version cmakeFlags; src = p.mlx-src-cpu.src.rev; };
      mlx-c-src-cpu = { inherit (p.mlx-c-src-cpu) pname version; src = p.mlx-c-src-cpu.src.rev; };
      exo = { inherit (p.exo) pname version ldflags subPackages postInstall; };
      exo-go-postInstall = p.exo-go.postInstall;
      default = p.default.name;
      app = outputs.apps.${system}.exo.program;
      checks = builtins.attrNames c;
      go-tests-env = c.go-tests.env;
      devShell = outputs.devShells.${system}.default.name;
    };
in
{
  inherit pkgsFor;
  report = {
    inputs = lib.mapAttrs (_: i: i.url) flake.inputs;
    systems = lib.genAttrs [ "aarch64-darwin" "aarch64-linux" "x86_64-linux" ] summary;
    modules = builtins.attrNames outputs.nixosModules ++ builtins.attrNames outputs.darwinModules;
    vmTestScript = outputs.checks.x86_64-linux.vm.testScript;
  };
}
