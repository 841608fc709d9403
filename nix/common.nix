# What the NixOS and nix-darwin modules share: the options every host has
# (enable, package, settings, host) and the cluster file built from settings
# and checked by `exo config check` at build time (a bad cluster file fails
# the system build, not the service).
{
  lib,
  pkgs,
  self,
  cfg,
  hostExample,
}:
let
  format = pkgs.formats.toml { };
  system = pkgs.stdenv.hostPlatform.system;
in
{
  clusterFile = pkgs.runCommand "exo-cluster.toml"
    {
      nativeBuildInputs = [ cfg.package ];
      raw = format.generate "cluster.toml" cfg.settings;
    }
    ''
      exo config check "$raw"
      cp "$raw" "$out"
    '';

  options = {
    enable = lib.mkEnableOption "exo-pd, disaggregated prefill/decode LLM serving (the exo supervisor)";

    package =
      lib.mkPackageOption pkgs "exo-pd" { }
      // lib.optionalAttrs (self != null) {
        default = self.packages.${system}.exo;
        defaultText = lib.literalExpression "exo-pd.packages.\${system}.exo";
      };

    settings = lib.mkOption {
      type = lib.types.submodule { freeformType = format.type; };
      default = { };
      description = ''
        The cluster file, /etc/exo/cluster.toml, as Nix values (see
        etc/exo/cluster.example.toml). Every host of the cluster should get
        the same settings; each supervisor runs only its own runners. The file
        is validated with `exo config check` when the system is built.
      '';
      example = lib.literalExpression ''
        {
          cluster.name = "lab";
          hosts.spark = { address = "10.0.0.10"; backend = "cuda"; };
          hosts.studio = { address = "10.0.0.20"; backend = "metal"; };
          models = [{
            name = "qwen3-8b";
            decode = { hosts = [ "studio" ]; source = "mlx-community/Qwen3-8B-4bit"; };
            prefill = { hosts = [ "spark" ]; source = "Qwen/Qwen3-8B"; };
          }];
        }
      '';
    };

    host = lib.mkOption {
      type = lib.types.nullOr lib.types.str;
      default = null;
      example = hostExample;
      description = "This machine's name in settings.hosts (`exo supervise --host`); null means the hostname.";
    };
  };
}
