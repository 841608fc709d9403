# MLX v0.31.2 built from source: not the flake's default (that is the PyPI
# wheel, nix/mlx-wheel.nix); the flake exposes the CPU flavour as
# mlx-src-cpu. As a shared C++ library, in three flavours:
#   Metal  (aarch64-darwin; needs the Metal toolchain from Xcode, see below)
#   CUDA   (Linux, nixpkgs cudaPackages with CUDA 13; the DGX Spark is sm_121)
#   CPU    (anywhere; OpenBLAS + LAPACKE)
# mlx-c's main branch (nix/mlx-c.nix) is generated for exactly this release:
# move both pins together (DESIGN.md §11).
#
# MLX's CMake fetches its dependencies at configure time; the Nix sandbox has
# no network, so every one is provided here: nlohmann_json and fmt from
# nixpkgs, cudnn-frontend by hash below; the CUDA header libraries (CCCL,
# NVTX, CUTLASS) and metal-cpp are arguments the caller provides (their
# hashes could not be computed where this was written; docs/NIX.md). GGUF
# support is off: its dependency (gguf-tools) is not packaged, and exo reads
# GGUF in Go and hands MLX the arrays.
{
  lib,
  stdenv,
  fetchFromGitHub,
  cmake,
  ninja,
  zsh,
  fmt,
  nlohmann_json,
  openblas,
  # Backend: "metal", "cuda" or "cpu".
  backend ? (if stdenv.hostPlatform.isDarwin then "metal" else "cpu"),
  # CUDA (backend = "cuda")
  cudaPackages ? null,
  cudaArchitectures ? [
    "121a-real" # DGX Spark (GB10)
    "90a-real" # Hopper
    "80-real" # Ampere
  ],
  cccl-src ? null, # github:NVIDIA/cccl release v3.1.3 (the zip MLX pins)
  nvtx-src ? null, # github:NVIDIA/NVTX v3.1.1
  cutlass-src ? null, # github:NVIDIA/cutlass v4.4.2
  # Metal (backend = "metal")
  metal-cpp-src ? null, # https://developer.apple.com/metal/cpp/files/metal-cpp_26.zip
  apple-sdk_26 ? null,
  # Where the Metal toolchain lives on the build machine (outside the store:
  # the `metal` compiler is not redistributable). Requires sandbox = relaxed.
  xcodeDeveloperDir ? "/Applications/Xcode.app/Contents/Developer",
}:

assert lib.elem backend [
  "metal"
  "cuda"
  "cpu"
];
assert backend == "cuda" -> cudaPackages != null && cccl-src != null && nvtx-src != null && cutlass-src != null;
assert backend == "metal" -> stdenv.hostPlatform.isDarwin && metal-cpp-src != null;

let
  cuda = backend == "cuda";
  metal = backend == "metal";

  # cudnn-frontend v1.16.0 (commit be6c079b), the tag MLX v0.31.2 fetches.
  # NAR hash computed from `git archive` of that commit.
  cudnn-frontend-src = fetchFromGitHub {
    owner = "NVIDIA";
    repo = "cudnn-frontend";
    rev = "be6c079be8aaffa0fc079fcf039887e637c289c7";
    hash = "sha256-+8aBl9dKd2Uz50XoOr91NRyJ4OGJtzfDNNNYGQJ9b94=";
  };

  # xcrun with the system developer dir instead of Nix's SDK variables, so
  # `xcrun -sdk macosx metal` finds Xcode's Metal compiler.
  xcrunShim = builtins.toFile "xcrun" ''
    #!/bin/sh
    exec /usr/bin/env -u SDKROOT DEVELOPER_DIR=${xcodeDeveloperDir} /usr/bin/xcrun "$@"
  '';
in
stdenv.mkDerivation (finalAttrs: {
  pname = "mlx" + lib.optionalString (backend != "metal") "-${backend}";
  version = "0.31.2";

  src = fetchFromGitHub {
    owner = "ml-explore";
    repo = "mlx";
    rev = "68cf2fddd8de5edd8ab3d926391772b2e2cedad8"; # tag v0.31.2
    # NAR hash of `git archive` of that commit, computed with nix-hash.
    hash = "sha256-0Oxacz61WGWZrpWw+fMQjEQfwOx1l1L2d0kWl54/LrQ=";
  };

  # MLX's CPU backend compiles fused kernels at run time with "g++".
  postPatch = ''
    substituteInPlace mlx/backend/cpu/jit_compiler.cpp \
      --replace-fail '"g++ ' '"${stdenv.cc}/bin/c++ '
  ''
  + lib.optionalString metal ''
    install -m755 ${xcrunShim} xcrun-shim
    substituteInPlace CMakeLists.txt --replace-fail /usr/bin/xcrun "$PWD/xcrun-shim"
    mkdir -p shim-bin && ln -s "$PWD/xcrun-shim" shim-bin/xcrun
    export PATH="$PWD/shim-bin:$PATH"
  '';

  # The Metal toolchain is outside the store: this derivation needs
  # `sandbox = relaxed` in nix.conf on the Mac that builds it.
  __noChroot = metal;

  nativeBuildInputs = [
    cmake
    ninja
  ]
  # MLX's Metal configuration runs its probes through `zsh -c`.
  ++ lib.optionals metal [ zsh ]
  ++ lib.optionals cuda [ cudaPackages.cuda_nvcc ];

  buildInputs = [
    fmt
    nlohmann_json
  ]
  ++ lib.optionals (!stdenv.hostPlatform.isDarwin) [ openblas ]
  ++ lib.optionals metal [ apple-sdk_26 ]
  ++ lib.optionals cuda (
    with cudaPackages;
    [
      cuda_cudart
      cuda_cccl
      cuda_nvrtc
      cuda_nvtx
      libcublas
      libcufft
      cudnn
    ]
  );

  # nixpkgs' cmake hook builds Release by default; said here because an
  # unoptimized libmlxc doubles the host time of every op (docs/BENCHMARKS.md).
  cmakeBuildType = "Release";

  cmakeFlags = [
    (lib.cmakeBool "BUILD_SHARED_LIBS" true)
    (lib.cmakeBool "MLX_BUILD_TESTS" false)
    (lib.cmakeBool "MLX_BUILD_EXAMPLES" false)
    (lib.cmakeBool "MLX_BUILD_BENCHMARKS" false)
    (lib.cmakeBool "MLX_BUILD_PYTHON_BINDINGS" false)
    (lib.cmakeBool "MLX_BUILD_PYTHON_STUBS" false)
    (lib.cmakeBool "MLX_USE_CCACHE" false)
    (lib.cmakeBool "MLX_BUILD_GGUF" false)
    (lib.cmakeBool "MLX_BUILD_SAFETENSORS" true)
    (lib.cmakeBool "MLX_BUILD_CPU" true)
    (lib.cmakeBool "MLX_BUILD_METAL" metal)
    (lib.cmakeBool "MLX_BUILD_CUDA" cuda)
    (lib.cmakeBool "USE_SYSTEM_FMT" true)
    (lib.cmakeBool "FETCHCONTENT_FULLY_DISCONNECTED" true)
    (lib.cmakeFeature "FETCHCONTENT_SOURCE_DIR_JSON" "${nlohmann_json.src}")
  ]
  ++ lib.optionals (!stdenv.hostPlatform.isDarwin) [
    (lib.cmakeFeature "BLA_VENDOR" "OpenBLAS")
  ]
  ++ lib.optionals metal [
    (lib.cmakeFeature "FETCHCONTENT_SOURCE_DIR_METAL_CPP" "${metal-cpp-src}")
  ]
  ++ lib.optionals cuda [
    (lib.cmakeFeature "MLX_CUDA_ARCHITECTURES" (lib.concatStringsSep ";" cudaArchitectures))
    (lib.cmakeFeature "FETCHCONTENT_SOURCE_DIR_CCCL" "${cccl-src}")
    (lib.cmakeFeature "FETCHCONTENT_SOURCE_DIR_NVTX3" "${nvtx-src}")
    (lib.cmakeFeature "FETCHCONTENT_SOURCE_DIR_CUDNN" "${cudnn-frontend-src}")
    (lib.cmakeFeature "FETCHCONTENT_SOURCE_DIR_CUTLASS" "${cutlass-src}")
    (lib.cmakeFeature "CUDNN_INCLUDE_PATH" "${lib.getDev cudaPackages.cudnn}/include")
    (lib.cmakeFeature "CUDNN_LIBRARY_PATH" "${lib.getLib cudaPackages.cudnn}/lib")
  ];

  passthru = {
    inherit backend;
  };

  meta = {
    description = "MLX array framework (${backend} backend), the engine under exo-pd's MLX runners";
    homepage = "https://github.com/ml-explore/mlx";
    license = lib.licenses.mit;
    platforms = if metal then [ "aarch64-darwin" ] else lib.platforms.linux ++ lib.platforms.darwin;
  };
})
