# nix-darwin module: services.exo runs `exo supervise` as the launchd daemon
# org.exo-pd.exo (RunAtLoad, KeepAlive on failure, logs under
# /var/log/exo), as the dedicated user _exo, with /etc/exo/cluster.toml
# written from services.exo.settings and validated at build time by
# `exo config check`. The job comes from nix/lib (shared with
# etc/launchd/org.exo-pd.exo.plist).
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
    hostExample = "studio";
  };
  inherit (common) clusterFile;

  stateDir = "/var/lib/exo";
  logDir = "/var/log/exo";

  job = exoLib.launchdDaemon {
    exe = lib.getExe cfg.package;
    configFile = "/etc/exo/cluster.toml";
    host = cfg.host;
    user = "_exo";
    group = "_exo";
    inherit stateDir logDir;
    environment = cfg.environment;
  };
in
{
  options.services.exo = common.options // {
    openFirewall = lib.mkOption {
      type = lib.types.bool;
      default = false;
      description = ''
        Accepted for symmetry with NixOS. macOS's firewall filters by
        application, not by port: when it is on, allow the exo binary
        (`/usr/libexec/ApplicationFirewall/socketfilterfw --add $(which exo)`),
        which this option does during activation.
      '';
    };

    environment = lib.mkOption {
      type = lib.types.attrsOf lib.types.str;
      default = { };
      description = "Extra environment for the supervisor and its runners (not for secrets: it lands in the store).";
    };

    uid = lib.mkOption {
      type = lib.types.int;
      default = 535;
      description = "uid of the _exo user (nix-darwin manages users with fixed ids).";
    };

    gid = lib.mkOption {
      type = lib.types.int;
      default = 535;
      description = "gid of the _exo group.";
    };
  };

  config = lib.mkIf cfg.enable {
    assertions = [
      {
        assertion = cfg.settings != { };
        message = "services.exo.settings is empty: describe the cluster (see etc/exo/cluster.example.toml).";
      }
    ];

    environment.etc."exo/cluster.toml".source = clusterFile;
    environment.systemPackages = [ cfg.package ];

    users.knownUsers = [ "_exo" ];
    users.knownGroups = [ "_exo" ];
    users.users._exo = {
      uid = cfg.uid;
      gid = cfg.gid;
      home = stateDir;
      shell = "/usr/bin/false";
      isHidden = true;
      description = "exo-pd supervisor";
    };
    users.groups._exo = {
      gid = cfg.gid;
      members = [ "_exo" ];
      description = "exo-pd supervisor";
    };

    # State (the model store) and logs, owned by the daemon's user.
    system.activationScripts.extraActivation.text = lib.mkAfter (
      ''
        mkdir -p ${stateDir}/models ${logDir}
        chown -R _exo:_exo ${stateDir} ${logDir}
        chmod 0750 ${stateDir}
      ''
      # The wrapper execs bin/.exo-wrapped, the process that listens.
      + lib.optionalString cfg.openFirewall ''
        for f in ${lib.getExe cfg.package} ${cfg.package}/bin/.exo-wrapped; do
          if [ -e "$f" ]; then
            /usr/libexec/ApplicationFirewall/socketfilterfw --add "$f" >/dev/null || true
            /usr/libexec/ApplicationFirewall/socketfilterfw --unblockapp "$f" >/dev/null || true
          fi
        done
      ''
    );

    launchd.daemons.exo.serviceConfig = job;
  };
}
