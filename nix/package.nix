# The exo binary (supervisor, runners and tools in one), built with
# buildGoModule. The MLX backend dlopens libmlxc at run time: the wrapper
# sets EXO_MLXC_PATH to the mlx-c package's lib directory (libmlxc and libmlx
# side by side) unless the environment already sets it. Built without mlx-c,
# exo serves on its pure-Go CPU backend only.
{
  lib,
  stdenv,
  buildGoModule,
  makeBinaryWrapper,
  mlx-c ? null,
  src,
  version ? "dev",
}:

buildGoModule {
  pname = "exo";
  inherit src version;

  # The one place the Go dependencies are pinned: the NAR hash of
  # `go mod vendor` for this tree. nix/update-vendor-hash.sh recomputes it
  # (CI checks it: nix/tests/check.sh).
  vendorHash = "sha256-ZCNkqaw5h/alBGX8EGxNDV6L8c3+uOnQjFhecv3kIm4=";

  subPackages = [ "cmd/exo" ];

  # cgo is needed for dlopen in the MLX backend (runners/engine/mlx).
  env.CGO_ENABLED = 1;

  ldflags = [
    "-s"
    "-w"
    "-X github.com/exo-pd/exo-pd/cmd/internal/version.Version=${version}"
  ];

  nativeBuildInputs = [ makeBinaryWrapper ];

  # The package's own tests run in the flake's `checks.go-tests`.
  doCheck = false;

  postInstall = lib.optionalString (mlx-c != null) ''
    wrapProgram $out/bin/exo --set-default EXO_MLXC_PATH ${mlx-c}/lib
  '';

  passthru = {
    inherit mlx-c;
  };

  meta = {
    description = "exo-pd: prefill on NVIDIA (MLX CUDA), decode on Apple Silicon (MLX Metal), KV cache over TCP";
    homepage = "https://github.com/exo-pd/exo-pd";
    license = lib.licenses.asl20;
    mainProgram = "exo";
    platforms = lib.platforms.linux ++ lib.platforms.darwin;
  };
}
