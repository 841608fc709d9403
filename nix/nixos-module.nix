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
  common = import ./common.nix {
    inherit lib pkgs self cfg;
    hostExample = "spark";
  };
  inherit (common) clusterFile;

  hostName = if cfg.host != null then cfg.host else config.networking.hostName;

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
  options.services.exo = common.options // {
    openFirewall = lib.mkOption {
      type = lib.types.bool;
      default = false;
      description = ''
        Open the TCP ports this host serves: the API gateway (api.port,
        52415) and, for the runners placed on this host, the decode HTTP,
        prefill KV and prefill metrics ports, pipeline stage links, tensor
        links and (on hosts whose backend is not cpu) MLX's ring ports
        (computed like the supervisor does: supervisor/config HostPorts,
        checked against nix/lib by nix/tests/fixtures/ports-cluster.json).
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

    # libmlx (mlx-cuda-13) loads the driver's libcuda.so.1 from
    # /run/opengl-driver/lib (its RUNPATH, set by addDriverRunpath), which
    # NixOS populates with the NVIDIA driver's libraries when graphics are
    # enabled (the driver itself: hardware.nvidia / videoDrivers, as for any
    # CUDA host).
    hardware.graphics.enable = lib.mkIf cfg.nvidia (lib.mkDefault true);

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
