# mlx-c (MLX's C API) at the main-branch commit generated for MLX v0.31.2,
# built as libmlxc against the MLX from nix/mlx.nix (any backend). The exo
# binary dlopens libmlxc at run time (runners/engine/mlx); libmlx is linked
# beside it in $out/lib so one directory holds both (EXO_MLXC_PATH points
# there), and the RUNPATH set by the build finds it too.
{
  lib,
  stdenv,
  fetchFromGitHub,
  cmake,
  ninja,
  mlx,
}:

stdenv.mkDerivation {
  pname = "mlx-c" + lib.optionalString (mlx.backend != "metal") "-${mlx.backend}";
  # mlx-c sets MLX_C_VERSION 0.6.0 at that commit; the suffix names the commit.
  version = "0.6.0-unstable-fba4470b";

  src = fetchFromGitHub {
    owner = "ml-explore";
    repo = "mlx-c";
    rev = "fba4470b89073180056c9ea46c443051375f7399"; # "regenerate bindings for MLX 0.31.2"
    # NAR hash of `git archive` of that commit, computed with nix-hash.
    hash = "sha256-qRd20rofnstvKesMxOwSlPZ508M3RHsh2Kh48D3yjuk=";
  };

  nativeBuildInputs = [
    cmake
    ninja
  ];
  buildInputs = [ mlx ];

  cmakeFlags = [
    (lib.cmakeBool "BUILD_SHARED_LIBS" true)
    (lib.cmakeBool "MLX_C_USE_SYSTEM_MLX" true)
    (lib.cmakeBool "MLX_C_BUILD_EXAMPLES" false)
    (lib.cmakeBool "FETCHCONTENT_FULLY_DISCONNECTED" true)
  ];

  postInstall = ''
    for f in ${mlx}/lib/libmlx*${stdenv.hostPlatform.extensions.sharedLibrary}*; do
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
