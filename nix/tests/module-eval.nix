# Evaluates the NixOS and nix-darwin modules with nixpkgs' module system
# (lib only: a checkout of nixpkgs' lib/ or nix-community/nixpkgs.lib) and
# stand-ins for the few NixOS / nix-darwin options and packages they use.
# The stand-in option declarations have the real option names and types, so
# a misspelt option or a value of the wrong type fails evaluation.
#   nix-instantiate --eval --strict --json nix/tests/module-eval.nix --arg lib 'import /path/to/nixpkgs/lib'
# nix/tests/check.sh runs it when EXO_NIXPKGS_LIB names such a lib directory.
{ lib }:
let
  inherit (lib) mkOption types;

  drv = name: extra: {
    type = "derivation";
    inherit name;
    outPath = "/nix/store/00000000000000000000000000000000-${name}";
    meta = { };
  } // extra;

  exo = drv "exo" { meta.mainProgram = "exo"; };

  pkgsFor = system: {
    stdenv.hostPlatform = {
      inherit system;
      isLinux = lib.hasSuffix "linux" system;
      isDarwin = lib.hasSuffix "darwin" system;
    };
    formats.toml = { }: {
      type = types.attrsOf types.anything;
      generate = name: value: builtins.toFile name (builtins.toJSON value);
    };
    runCommand = name: env: script: drv name { inherit env script; };
    coreutils = drv "coreutils" { };
  };

  self = {
    packages.x86_64-linux.exo = exo;
    packages.aarch64-darwin.exo = exo;
  };

  unitOption = types.oneOf [
    types.bool
    types.int
    types.str
    types.path
    types.package
    (types.listOf (types.oneOf [ types.str types.int types.bool types.path ]))
  ];

  common = {
    options = {
      assertions = mkOption {
        type = types.listOf types.unspecified;
        default = [ ];
      };
      environment.systemPackages = mkOption {
        type = types.listOf types.package;
        default = [ ];
      };
      environment.etc = mkOption {
        type = types.attrsOf (types.submodule { options.source = mkOption { type = types.path; }; });
        default = { };
      };
    };
  };

  nixosStub = {
    imports = [ common ];
    options = {
      warnings = mkOption {
        type = types.listOf types.str;
        default = [ ];
      };
      hardware.graphics.enable = mkOption {
        type = types.bool;
        default = false;
      };
      networking.hostName = mkOption {
        type = types.str;
        default = "spark";
      };
      networking.firewall.allowedTCPPorts = mkOption {
        type = types.listOf types.port;
        default = [ ];
      };
      users.users = mkOption {
        type = types.attrsOf (types.submodule {
          options = {
            isSystemUser = mkOption { type = types.bool; default = false; };
            group = mkOption { type = types.str; default = ""; };
            home = mkOption { type = types.path; default = "/var/empty"; };
            description = mkOption { type = types.str; default = ""; };
          };
        });
        default = { };
      };
      users.groups = mkOption {
        type = types.attrsOf (types.submodule { });
        default = { };
      };
      systemd.services = mkOption {
        type = types.attrsOf (types.submodule {
          options = {
            description = mkOption { type = types.str; default = ""; };
            documentation = mkOption { type = types.listOf types.str; default = [ ]; };
            after = mkOption { type = types.listOf types.str; default = [ ]; };
            wants = mkOption { type = types.listOf types.str; default = [ ]; };
            wantedBy = mkOption { type = types.listOf types.str; default = [ ]; };
            startLimitIntervalSec = mkOption { type = types.int; };
            startLimitBurst = mkOption { type = types.int; };
            reloadTriggers = mkOption { type = types.listOf unitOption; default = [ ]; };
            restartTriggers = mkOption { type = types.listOf unitOption; default = [ ]; };
            environment = mkOption {
              type = types.attrsOf (types.nullOr (types.oneOf [ types.str types.path types.package ]));
              default = { };
            };
            serviceConfig = mkOption { type = types.attrsOf unitOption; default = { }; };
          };
        });
        default = { };
      };
    };
  };

  darwinStub = {
    imports = [ common ];
    options = {
      users.knownUsers = mkOption { type = types.listOf types.str; default = [ ]; };
      users.knownGroups = mkOption { type = types.listOf types.str; default = [ ]; };
      users.users = mkOption {
        type = types.attrsOf (types.submodule {
          options = {
            uid = mkOption { type = types.int; };
            gid = mkOption { type = types.int; };
            home = mkOption { type = types.path; };
            shell = mkOption { type = types.either types.str types.path; };
            isHidden = mkOption { type = types.bool; };
            description = mkOption { type = types.str; };
          };
        });
        default = { };
      };
      users.groups = mkOption {
        type = types.attrsOf (types.submodule {
          options = {
            gid = mkOption { type = types.int; };
            members = mkOption { type = types.listOf types.str; };
            description = mkOption { type = types.str; };
          };
        });
        default = { };
      };
      system.activationScripts = mkOption {
        type = types.attrsOf (types.submodule { options.text = mkOption { type = types.lines; default = ""; }; });
        default = { };
      };
      launchd.daemons = mkOption {
        type = types.attrsOf (types.submodule {
          options.serviceConfig = mkOption { type = types.attrsOf types.anything; default = { }; };
        });
        default = { };
      };
    };
  };

  settings = {
    cluster = { name = "lab"; secret_file = "/etc/exo/secret"; };
    hosts.spark = { address = "10.0.0.10"; backend = "cuda"; };
    hosts.studio = { address = "10.0.0.20"; backend = "metal"; };
    models = [
      {
        name = "qwen3-8b";
        decode = { hosts = [ "studio" ]; source = "mlx-community/Qwen3-8B-4bit"; };
        prefill = { hosts = [ "spark" ]; source = "Qwen/Qwen3-8B"; };
      }
    ];
  };

  eval =
    system: stub: module: cfg:
    (lib.evalModules {
      modules = [
        stub
        module
        { services.exo = cfg; }
      ];
      specialArgs.pkgs = pkgsFor system;
    }).config;

  checkAssertions = c: map (a: a.message) (builtins.filter (a: !a.assertion) c.assertions);

  nixos = eval "x86_64-linux" nixosStub (import ../nixos-module.nix { inherit self; }) {
    enable = true;
    openFirewall = true;
    environment.HF_ENDPOINT = "https://hf-mirror.example";
    environmentFile = "/run/secrets/exo.env";
    inherit settings;
  };
  nixosOff = eval "x86_64-linux" nixosStub (import ../nixos-module.nix { inherit self; }) { };
  nixosEmpty = eval "x86_64-linux" nixosStub (import ../nixos-module.nix { inherit self; }) { enable = true; };
  nixosStranger = eval "x86_64-linux" nixosStub (import ../nixos-module.nix { inherit self; }) {
    enable = true;
    host = "nothere";
    openFirewall = true;
    inherit settings;
  };

  darwin = eval "aarch64-darwin" darwinStub (import ../darwin-module.nix { inherit self; }) {
    enable = true;
    host = "studio";
    openFirewall = true;
    inherit settings;
  };
in
{
  report.nixos = {
    failedAssertions = checkAssertions nixos;
    inherit (nixos.networking.firewall) allowedTCPPorts;
    service = nixos.systemd.services.exo;
    etc = lib.mapAttrs (_: e: toString e.source) nixos.environment.etc;
    users = nixos.users.users;
    disabledDefinesNothing = nixosOff.systemd.services == { } && nixosOff.networking.firewall.allowedTCPPorts == [ ];
    emptySettingsAsserts = checkAssertions nixosEmpty;
    warnings = nixos.warnings;
    strangerWarnings = nixosStranger.warnings;
    strangerPorts = nixosStranger.networking.firewall.allowedTCPPorts;
    driverLibraries = nixos.hardware.graphics.enable;
  };
  report.darwin = {
    failedAssertions = checkAssertions darwin;
    daemon = darwin.launchd.daemons.exo.serviceConfig;
    activation = darwin.system.activationScripts.extraActivation.text;
    users = darwin.users.users;
    groups = darwin.users.groups;
    inherit (darwin.users) knownUsers knownGroups;
    etc = lib.mapAttrs (_: e: toString e.source) darwin.environment.etc;
  };
}
