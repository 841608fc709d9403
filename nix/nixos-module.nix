# NixOS module: services.exo runs `exo supervise` as a systemd service
# (Type=notify, watchdog, reload on SIGHUP) with /etc/exo/cluster.toml
# written from services.exo.settings and validated at build time by
# `exo config check`: a bad cluster file fails nixos-rebuild, not the service.
# The unit's settings come from nix/lib (shared with etc/systemd/exo.service).
{ self ? null }:
{
  config,
  lib,
  pkgs,
  ...
}:
let
  cfg = config.services.exo;
  exoLib = import ./lib;
  format = pkgs.formats.toml { };
  system = pkgs.stdenv.hostPlatform.system;

  hostName = if cfg.host != null then cfg.host else config.networking.hostName;

  # The TOML from settings, checked by the exo that will read it.
  clusterFile = pkgs.runCommand "exo-cluster.toml"
    {
      nativeBuildInputs = [ cfg.package ];
      raw = format.generate "cluster.toml" cfg.settings;
    }
    ''
      exo config check "$raw"
      cp "$raw" "$out"
    '';

  unit = exoLib.systemdUnit {
    exe = lib.getExe cfg.package;
    configFile = "/etc/exo/cluster.toml";
    host = cfg.host;
    kill = "${pkgs.coreutils}/bin/kill";
    user = "exo";
    group = "exo";
    stateDirectory = "exo";
    watchdogSec = cfg.watchdogSec;
    nvidia = cfg.nvidia;
  };
in
{
  options.services.exo = {
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
      example = "spark";
      description = "This machine's name in settings.hosts (`exo supervise --host`); null means the hostname.";
    };

    openFirewall = lib.mkOption {
      type = lib.types.bool;
      default = false;
      description = ''
        Open the TCP ports this host serves: the API gateway (api.port,
        52415) and, for the runners placed on this host, the decode HTTP,
        prefill KV and prefill metrics ports (computed like the supervisor does).
      '';
    };

    nvidia = lib.mkOption {
      type = lib.types.bool;
      default = pkgs.stdenv.hostPlatform.isLinux;
      defaultText = lib.literalExpression "pkgs.stdenv.hostPlatform.isLinux";
      description = "Let the service open the NVIDIA devices (CUDA backend).";
    };

    watchdogSec = lib.mkOption {
      type = lib.types.ints.positive;
      default = 30;
      description = "systemd WatchdogSec; the supervisor pings at half of it.";
    };

    environmentFile = lib.mkOption {
      type = lib.types.nullOr lib.types.path;
      default = null;
      example = "/run/secrets/exo.env";
      description = "EnvironmentFile for secrets such as HF_TOKEN=hf_… (kept out of the Nix store).";
    };

    environment = lib.mkOption {
      type = lib.types.attrsOf lib.types.str;
      default = { };
      example = {
        HF_ENDPOINT = "https://hf-mirror.example";
      };
      description = "Extra environment for the supervisor and its runners.";
    };

    ports = lib.mkOption {
      type = lib.types.listOf lib.types.port;
      readOnly = true;
      default = exoLib.hostPorts {
        settings = cfg.settings;
        host = hostName;
      };
      defaultText = lib.literalMD "computed from `settings` and `host`";
      description = "The TCP ports this host serves (what openFirewall opens).";
    };
  };

  config = lib.mkIf cfg.enable {
    assertions = [
      {
        assertion = cfg.settings != { };
        message = "services.exo.settings is empty: describe the cluster (see etc/exo/cluster.example.toml).";
      }
    ];

    # The supervisor can also recognise itself by a local address, which
    # cannot be known here: warn, do not fail.
    warnings = lib.optional (cfg.settings != { } && !((cfg.settings.hosts or { }) ? ${hostName})) (
      "services.exo: \"${hostName}\" is not in settings.hosts, so openFirewall opens only the API port "
      + "and the supervisor must find itself by address; set services.exo.host to its name there."
    );

    environment.etc."exo/cluster.toml".source = clusterFile;
    environment.systemPackages = [ cfg.package ];

    users.users.exo = {
      isSystemUser = true;
      group = "exo";
      home = "/var/lib/exo";
      description = "exo-pd supervisor";
    };
    users.groups.exo = { };

    networking.firewall.allowedTCPPorts = lib.mkIf cfg.openFirewall cfg.ports;

    systemd.services.exo = {
      description = unit.Unit.Description;
      documentation = [ unit.Unit.Documentation ];
      after = unit.Unit.After;
      wants = unit.Unit.Wants;
      wantedBy = unit.Install.WantedBy;
      startLimitIntervalSec = unit.Unit.StartLimitIntervalSec;
      startLimitBurst = unit.Unit.StartLimitBurst;
      # A new cluster file reloads (SIGHUP; the supervisor restarts only the
      # runners that changed) instead of restarting the service.
      reloadTriggers = [ clusterFile ];
      restartTriggers = [ cfg.package ];
      environment = {
        EXO_MODELS_DIR = "/var/lib/exo/models";
        HOME = "/var/lib/exo";
      }
      // cfg.environment;
      serviceConfig =
        removeAttrs unit.Service [ "Environment" ]
        // lib.optionalAttrs (cfg.environmentFile != null) {
          EnvironmentFile = cfg.environmentFile;
        };
    };
  };
}
