# MLX from its release wheel on PyPI (nix/mlx-wheels.json: URL and sha256
# per flavour and system), the default MLX of the flake: no MLX compile, no
# Metal compiler, no CUDA toolkit build. The wheel carries what mlx-c needs:
# lib/libmlx.{so,dylib}, include/, share/cmake/MLX (a relocatable CMake
# package), and on macOS lib/mlx.metallib, which libmlx loads from the
# directory it was itself loaded from (so it stays beside libmlx.dylib).
#   metal  aarch64-darwin  mlx-metal
#   cuda   aarch64-linux, x86_64-linux  mlx-cuda-13 (CUDA 13; sm_121 included)
#   cpu    Linux: mlx-cpu; on aarch64-darwin the mlx-metal wheel (MLX's CPU
#          backend is part of it)
# Linux wheels are manylinux builds: their RPATH points into a Python
# site-packages tree (nvidia/*/lib), so it is removed and autoPatchelf links
# libmlx against nixpkgs' CUDA 13 libraries (cuBLAS, NVRTC, cuDNN 9, NCCL)
# and the BLAS/LAPACK the wheel bundles; libcuda.so.1 comes from the driver
# at run time (/run/opengl-driver/lib, added by addDriverRunpath).
{
  lib,
  stdenv,
  fetchurl,
  unzip,
  autoPatchelfHook ? null,
  addDriverRunpath ? null,
  cudaPackages ? null,
  # "metal", "cuda" or "cpu"
  backend ? (if stdenv.hostPlatform.isDarwin then "metal" else "cpu"),
}:

let
  pins = lib.importJSON ./mlx-wheels.json;
  system = stdenv.hostPlatform.system;
  darwin = stdenv.hostPlatform.isDarwin;
  cuda = backend == "cuda";
  flavour = if darwin && backend == "cpu" then "metal" else backend;
  wheel =
    pins.wheels.${flavour}.${system}
      or (throw "MLX ${pins.version}: PyPI has no ${flavour} wheel for ${system} (nix/mlx-wheels.json)");
in
assert lib.elem backend [
  "metal"
  "cuda"
  "cpu"
];
assert cuda -> cudaPackages != null && addDriverRunpath != null;
assert !darwin -> autoPatchelfHook != null;

stdenv.mkDerivation {
  pname = "mlx" + lib.optionalString (backend != "metal") "-${backend}";
  inherit (pins) version;

  src = fetchurl {
    inherit (wheel) url sha256;
  };

  nativeBuildInputs = [
    unzip
  ]
  ++ lib.optionals (!darwin) [ autoPatchelfHook ]
  ++ lib.optionals cuda [ addDriverRunpath ];

  # What autoPatchelf links libmlx against (beside the wheel's own libs).
  buildInputs =
    lib.optionals (!darwin) [ stdenv.cc.cc.lib ]
    ++ lib.optionals cuda (
      with cudaPackages;
      [
        libcublas
        cuda_nvrtc
        cudnn
        nccl
      ]
    );

  # The driver's library: not in the store, found at run time.
  autoPatchelfIgnoreMissingDeps = lib.optionals cuda [ "libcuda.so.1" ];

  dontConfigure = true;
  dontBuild = true;
  unpackPhase = ''
    runHook preUnpack
    unzip -q $src -d wheel
    runHook postUnpack
  '';

  installPhase = ''
    runHook preInstall
    mkdir -p $out
    cp -r wheel/mlx/lib wheel/mlx/include wheel/mlx/share $out/
    # auditwheel's bundled BLAS/LAPACK (Linux wheels), beside libmlx.
    for d in wheel/mlx_*.libs; do
      if [ -d "$d" ]; then cp "$d"/* $out/lib/; fi
    done
    test -e $out/lib/libmlx${stdenv.hostPlatform.extensions.sharedLibrary}
    test -e $out/share/cmake/MLX/MLXConfig.cmake
  ''
  + lib.optionalString (!darwin) ''
    # Drop the wheel's site-packages RPATH; autoPatchelf sets the store's.
    for f in $out/lib/*.so*; do
      patchelf --remove-rpath "$f"
    done
  ''
  + lib.optionalString darwin ''
    # The wheel's install name is @rpath/libmlx.dylib: make it absolute so
    # mlx-c (and anything else linking it) finds this copy.
    install_name_tool -id $out/lib/libmlx.dylib $out/lib/libmlx.dylib
    test -e $out/lib/mlx.metallib
  ''
  + ''
    runHook postInstall
  '';

  postFixup = lib.optionalString cuda ''
    addDriverRunpath $out/lib/libmlx.so
  '';

  passthru = {
    inherit backend wheel;
  };

  meta = {
    description = "MLX ${pins.version} (${backend} backend) from its PyPI release wheel";
    homepage = "https://github.com/ml-explore/mlx";
    license = lib.licenses.mit;
    sourceProvenance = [ lib.sourceTypes.binaryNativeCode ];
    platforms =
      if backend == "cpu" then
        lib.attrNames pins.wheels.cpu ++ [ "aarch64-darwin" ]
      else
        lib.attrNames pins.wheels.${backend};
  };
}
