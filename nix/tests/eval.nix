# Evaluated by nix/tests/check.sh with a bare nix-instantiate (no nixpkgs):
# each attribute is compared with nix/tests/fixtures/<name>.
let
  lib = import ../lib;

  # A cluster like etc/exo/cluster.example.toml, as services.exo.settings.
  settings = {
    cluster = {
      name = "lab";
      runner_port_base = 52500;
    };
    api.port = 52415;
    hosts = {
      spark = { address = "10.0.0.10"; backend = "cuda"; };
      studio = { address = "10.0.0.20"; backend = "metal"; };
      mini = { address = "10.0.0.21"; backend = "metal"; };
    };
    models = [
      {
        name = "qwen3-8b";
        decode = { hosts = [ "studio" "mini" ]; source = "mlx-community/Qwen3-8B-4bit"; };
        prefill = { hosts = [ "spark" ]; source = "Qwen/Qwen3-8B"; };
      }
      {
        name = "llama-3.1-8b";
        source = "meta-llama/Llama-3.1-8B-Instruct";
        decode = { hosts = [ "studio" ]; port = 52600; };
        prefill = { hosts = [ "spark" ]; port = 52601; metrics_port = 52602; };
      }
      {
        # no ports given, third model: base + 20 (+1, +2)
        name = "smollm2";
        source = "builtin:smollm2";
        decode = { hosts = [ "mini" ]; };
        prefill = { hosts = [ "spark" "studio" ]; };
      }
    ];
  };
  portsOf = host: lib.hostPorts { inherit settings host; };
in
{
  # The unit and plist for installs without Nix (etc/): fixed paths.
  "exo.service" = lib.renderINI (lib.systemdUnit { exe = "/usr/local/bin/exo"; });
  "org.exo-pd.exo.plist" = lib.toPlist (lib.launchdDaemon { exe = "/usr/local/bin/exo"; });
  "ports.json" = builtins.toJSON {
    spark = portsOf "spark";
    studio = portsOf "studio";
    mini = portsOf "mini";
    elsewhere = portsOf "elsewhere";
    # defaults only: an empty cluster still serves the API
    empty = lib.hostPorts { settings = { }; host = "x"; };
    # a host pinned with --host, with a custom API port
    pinned = lib.hostPorts {
      settings = { api.port = 8080; models = [ { name = "m"; decode.hosts = [ "a" ]; } ]; };
      host = "a";
    };
  };
  # Every host of ports-cluster.toml: supervisor/config's
  # TestHostPortsMatchNix checks Config.HostPorts against the same fixture.
  "ports-cluster.json" =
    let
      s = builtins.fromTOML (builtins.readFile ./ports-cluster.toml);
    in
    builtins.toJSON (builtins.mapAttrs (host: _: lib.hostPorts { settings = s; inherit host; }) s.hosts);
  "supervise-args.json" = builtins.toJSON [
    (lib.supervisorArgs { exe = "exo"; })
    (lib.supervisorArgs { exe = "exo"; configFile = "/nix/store/x-cluster.toml"; host = "spark"; })
  ];
  "escape.plist" = lib.toPlist { a = "x < y & z"; b = [ 1 true false ]; c = { }; };
}
