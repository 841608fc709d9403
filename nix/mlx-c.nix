# mlx-c (MLX's C API) built as libmlxc against the MLX given (the PyPI wheel
# of nix/mlx-wheel.nix, or the from-source build of nix/mlx.nix). mlx-c is
# generated for one MLX release, so the source follows MLX's version:
#   MLX 0.31.1 (the wheels)      mlx-c tag v0.6.0 (bumped to MLX v0.31.1)
#   MLX 0.31.2 (from source)     mlx-c main fba4470b ("regenerate bindings for MLX 0.31.2")
# The exo binary dlopens libmlxc at run time (runners/engine/mlx); libmlx is
# linked beside it in $out/lib so one directory holds both (EXO_MLXC_PATH
# points there), and the RUNPATH set by the build finds it too.
{
  lib,
  stdenv,
  fetchFromGitHub,
  cmake,
  ninja,
  mlx,
}:

let
  # NAR hashes of `git archive` of each commit, computed with nix-hash.
  sources = {
    "0.31.1" = {
      version = "0.6.0";
      rev = "0726ca922fc902c4c61ef9c27d94132be418e945"; # tag v0.6.0
      hash = "sha256-humu7Y2ISx89/jz5/20iQ/exteBWtqaSAboZz8XaxlA=";
    };
    "0.31.2" = {
      # mlx-c sets MLX_C_VERSION 0.6.0 at that commit; the suffix names the commit.
      version = "0.6.0-unstable-fba4470b";
      rev = "fba4470b89073180056c9ea46c443051375f7399";
      hash = "sha256-qRd20rofnstvKesMxOwSlPZ508M3RHsh2Kh48D3yjuk=";
    };
  };
  pin = sources.${mlx.version} or (throw "mlx-c: no pinned mlx-c for MLX ${mlx.version} (nix/mlx-c.nix)");
in
stdenv.mkDerivation {
  pname = "mlx-c" + lib.optionalString (mlx.backend != "metal") "-${mlx.backend}";
  inherit (pin) version;

  src = fetchFromGitHub {
    owner = "ml-explore";
    repo = "mlx-c";
    inherit (pin) rev hash;
  };

  nativeBuildInputs = [
    cmake
    ninja
  ];
  buildInputs = [ mlx ];

  # nixpkgs' cmake hook builds Release by default; said here because an
  # unoptimized libmlxc doubles the host time of every op (docs/BENCHMARKS.md).
  cmakeBuildType = "Release";

  cmakeFlags = [
    (lib.cmakeBool "BUILD_SHARED_LIBS" true)
    (lib.cmakeBool "MLX_C_USE_SYSTEM_MLX" true)
    (lib.cmakeBool "MLX_C_BUILD_EXAMPLES" false)
    (lib.cmakeBool "FETCHCONTENT_FULLY_DISCONNECTED" true)
    (lib.cmakeFeature "MLX_DIR" "${mlx}/share/cmake/MLX")
  ];

  postInstall = ''
    for f in ${mlx}/lib/*; do
      ln -s "$f" "$out/lib/$(basename "$f")"
    done
    test -e $out/lib/libmlxc${stdenv.hostPlatform.extensions.sharedLibrary}
  '';

  passthru = {
    inherit mlx;
  };

  meta = {
    description = "C API for MLX (${mlx.backend} backend)";
    homepage = "https://github.com/ml-explore/mlx-c";
    license = lib.licenses.mit;
    inherit (mlx.meta) platforms;
  };
}
