# Pure helpers for the exo modules: no nixpkgs, only builtins, so that
# nix/tests/check.sh can evaluate them with a bare nix-instantiate (CI has no
# Nix store). The NixOS module, the nix-darwin module and the unit/plist
# shipped in etc/ for installs without Nix are all produced from these, which
# keeps them in step.
let
  inherit (builtins)
    attrNames
    concatMap
    concatStringsSep
    elem
    elemAt
    foldl'
    genList
    isAttrs
    isBool
    isInt
    isList
    isString
    length
    replaceStrings
    sort
    toString
    ;

  unique = xs: foldl' (acc: x: if elem x acc then acc else acc ++ [ x ]) [ ] xs;
  orDefault = v: d: if v == null || v == 0 then d else v;
in
rec {
  # The cluster file's port rules (supervisor/config, Config.HostPorts):
  # the API gateway on api.port (52415) on every host; model i (file order)
  # has the block base = runner_port_base + 10*i: decode HTTP at base,
  # prefill KV wire at base+1, prefill /health and /metrics at base+2
  # (unless the model gives those three ports itself), a decode pipeline
  # stage's link at base+3, a decode tensor rank 0's link at base+4, a
  # prefill pipeline stage's link at base+6, a prefill tensor rank 0's
  # link at base+8. MLX's ring (or JACCL's coordinator, or NCCL's
  # rendezvous) takes the port after a link: base+4 for one-host pipeline
  # stages, base+5 and base+9 for every tensor rank, on hosts whose
  # backend is not cpu.
  defaults = {
    apiPort = 52415;
    runnerPortBase = 52500;
    portsPerModel = 10;
  };

  # hostPorts { settings, host } -> sorted TCP ports `host` listens on.
  # settings is the cluster file as a Nix value (services.exo.settings, or
  # builtins.fromTOML of a cluster file). nix/tests/fixtures/ports-cluster.json
  # is what both this and the Go code give for nix/tests/ports-cluster.toml.
  hostPorts =
    { settings, host }:
    let
      apiPort = orDefault ((settings.api or { }).port or null) defaults.apiPort;
      base = orDefault ((settings.cluster or { }).runner_port_base or null) defaults.runnerPortBase;
      models = settings.models or [ ];
      mlx = (((settings.hosts or { }).${host} or { }).backend or "cpu") != "cpu";
      # host's place in a role's hosts (groups: every group's, in order), or -1
      hostsOf = role: if role ? groups then builtins.concatLists role.groups else role.hosts or [ ];
      indexOf =
        xs:
        let
          go = i: if i >= length xs then -1 else if elemAt xs i == host then i else go (i + 1);
        in
        go 0;
      when = cond: ports: if cond then ports else [ ];
      portsOf =
        i:
        let
          m = elemAt models i;
          b = base + defaults.portsPerModel * i;
          d = m.decode or null;
          p = m.prefill or null;
          shard = role: role.shard or "replicas";
          dk = if d == null then -1 else indexOf (hostsOf d);
          pk = if p == null then -1 else indexOf (hostsOf p);
          pipeline = d != null && shard d == "pipeline";
          # ranks per tensor group: a pipeline stage's (decode.tensor), or the whole tensor group's
          ranks =
            if pipeline && (d.tensor or 0) >= 2 then
              d.tensor
            else if d != null && shard d == "tensor" then
              length (hostsOf d)
            else
              1;
          lead = dk - ranks * (dk / ranks) == 0; # rank 0 of its stage or group
        in
        when (dk >= 0) (
          [ (orDefault (d.port or null) b) ]
          ++ when (pipeline && lead) [ (b + 3) ]
          ++ when (pipeline && ranks == 1 && mlx) [ (b + 4) ]
          ++ when (ranks > 1 && lead) [ (b + 4) ]
          ++ when (ranks > 1 && mlx) [ (b + 5) ]
        )
        ++ when (pk >= 0) (
          [
            (orDefault (p.port or null) (b + 1))
            (orDefault (p.metrics_port or null) (b + 2))
          ]
          ++ when (shard p == "pipeline") [ (b + 6) ]
          ++ when (shard p == "pipeline" && mlx) [ (b + 7) ]
          ++ when (shard p == "tensor" && pk == 0) [ (b + 8) ]
          ++ when (shard p == "tensor" && mlx) [ (b + 9) ]
        );
    in
    sort builtins.lessThan (unique ([ apiPort ] ++ concatMap portsOf (genList (i: i) (length models))));

  # supervisorArgs: the command line systemd and launchd start.
  supervisorArgs =
    {
      exe,
      configFile ? "/etc/exo/cluster.toml",
      host ? null,
    }:
    [
      exe
      "supervise"
      "--config"
      configFile
    ]
    ++ (if host == null then [ ] else [ "--host" host ]);

  # systemdUnit: the exo.service unit as { Unit, Service, Install } attrsets.
  # Values are strings, integers, booleans or lists (a list is a key repeated).
  systemdUnit =
    {
      exe,
      configFile ? "/etc/exo/cluster.toml",
      host ? null,
      kill ? "/bin/kill",
      user ? "exo",
      group ? "exo",
      stateDirectory ? "exo", # /var/lib/exo; models in /var/lib/exo/models
      watchdogSec ? 30,
      nvidia ? true,
      environment ? { },
    }:
    {
      Unit = {
        Description = "exo-pd supervisor (prefill/decode LLM serving)";
        Documentation = "https://github.com/exo-pd/exo-pd";
        After = [ "network-online.target" ];
        Wants = [ "network-online.target" ];
        # Bounded restarts: at most 10 starts in 10 minutes, then the unit
        # stays failed until an operator looks (systemctl reset-failed).
        StartLimitIntervalSec = 600;
        StartLimitBurst = 10;
      };
      Service = {
        # exo supervise sends READY=1 once its runners are up, RELOADING=1
        # and READY=1 around a reload, WATCHDOG=1 at half of WatchdogSec.
        Type = "notify";
        NotifyAccess = "main";
        ExecStartPre = "${exe} config check ${configFile}";
        ExecStart = concatStringsSep " " (supervisorArgs { inherit exe configFile host; });
        # While models download the supervisor extends this (EXTEND_TIMEOUT_USEC).
        TimeoutStartSec = 300;
        ExecReload = "${kill} -HUP $MAINPID";
        WatchdogSec = watchdogSec;
        Restart = "on-failure";
        # Exponential backoff 2 s → 60 s over 6 steps (systemd ≥ 254).
        RestartSec = 2;
        RestartSteps = 6;
        RestartMaxDelaySec = 60;
        # The supervisor stops its runners itself (SIGTERM to each process
        # group, SIGKILL after a grace period); KillMode=mixed lets it, and
        # still kills leftovers when the stop timeout runs out.
        KillMode = "mixed";
        TimeoutStopSec = 45;
        User = user;
        Group = group;
        StateDirectory = stateDirectory;
        StateDirectoryMode = "0750";
        WorkingDirectory = "/var/lib/${stateDirectory}";
        Environment = [
          "EXO_MODELS_DIR=/var/lib/${stateDirectory}/models"
          "HOME=/var/lib/${stateDirectory}"
        ]
        ++ map (k: "${k}=${environment.${k}}") (attrNames environment);
        LimitNOFILE = 65536;
        UMask = "0027";

        # Hardening. Not set: MemoryDenyWriteExecute (the CUDA driver and
        # MLX's CPU JIT map executable memory) and PrivateDevices (the GPU).
        NoNewPrivileges = true;
        ProtectSystem = "strict";
        ProtectHome = true;
        PrivateTmp = true;
        ProtectKernelTunables = true;
        ProtectKernelModules = true;
        ProtectKernelLogs = true;
        ProtectControlGroups = true;
        ProtectClock = true;
        ProtectHostname = true;
        ProtectProc = "invisible";
        RestrictNamespaces = true;
        RestrictRealtime = true;
        RestrictSUIDSGID = true;
        LockPersonality = true;
        RemoveIPC = true;
        CapabilityBoundingSet = "";
        SystemCallArchitectures = "native";
        RestrictAddressFamilies = "AF_UNIX AF_INET AF_INET6 AF_NETLINK";
        DevicePolicy = "closed";
        # GPU access for the CUDA backend: the NVIDIA character devices by
        # their /proc/devices group names (nvidia0, nvidiactl, uvm, caps).
        DeviceAllow =
          if nvidia then
            [
              "char-nvidia-frontend rw"
              "char-nvidia-uvm rw"
              "char-nvidia-caps r"
              "char-nvidia-caps-imex-channels r"
            ]
          else
            [ ];
      };
      Install = {
        WantedBy = [ "multi-user.target" ];
      };
    };

  # renderINI: a systemd unit file from systemdUnit's shape.
  renderINI =
    unit:
    let
      value = v: if isBool v then (if v then "yes" else "no") else toString v;
      lines =
        k: v:
        if isList v then
          (if v == [ ] then [ ] else map (x: "${k}=${value x}") v)
        else
          [ "${k}=${value v}" ];
      section =
        name:
        let
          s = unit.${name};
        in
        "[${name}]\n" + concatStringsSep "" (map (l: l + "\n") (concatMap (k: lines k s.${k}) (attrNames s)));
      order = builtins.filter (n: unit ? ${n}) [
        "Unit"
        "Service"
        "Install"
      ];
    in
    "# Generated from nix/lib/default.nix (systemdUnit); keep in step with nix/nixos-module.nix.\n"
    + concatStringsSep "\n" (map section order);

  # launchdDaemon: the launchd job for exo supervise (the plist's top dict).
  launchdDaemon =
    {
      exe,
      configFile ? "/etc/exo/cluster.toml",
      host ? null,
      label ? "org.exo-pd.exo",
      user ? "_exo",
      group ? "_exo",
      stateDir ? "/usr/local/var/lib/exo",
      logDir ? "/usr/local/var/log/exo",
      environment ? { },
    }:
    {
      Label = label;
      ProgramArguments = supervisorArgs { inherit exe configFile host; };
      RunAtLoad = true;
      # Restart after a crash or a non-zero exit, not after a clean stop;
      # launchd spaces restarts by ThrottleInterval seconds.
      KeepAlive = {
        SuccessfulExit = false;
      };
      ThrottleInterval = 10;
      # Time between SIGTERM and SIGKILL at stop: the supervisor stops its
      # runners first (SIGTERM, then SIGKILL after its own grace period).
      ExitTimeOut = 45;
      # Not an App Nap candidate: a server answering requests.
      ProcessType = "Interactive";
      UserName = user;
      GroupName = group;
      WorkingDirectory = stateDir;
      StandardOutPath = "${logDir}/exo.log";
      StandardErrorPath = "${logDir}/exo.log";
      SoftResourceLimits = {
        NumberOfFiles = 65536;
      };
      EnvironmentVariables = {
        EXO_MODELS_DIR = "${stateDir}/models";
        HOME = stateDir;
      }
      // environment;
    };

  # toPlist: an XML property list from a Nix value (dicts keep Nix's sorted
  # key order, as launchd does not care).
  toPlist =
    v:
    let
      esc = replaceStrings [ "&" "<" ">" ] [ "&amp;" "&lt;" "&gt;" ];
      ind = n: concatStringsSep "" (genList (_: "\t") n);
      go =
        n: x:
        if isBool x then
          "${ind n}<${if x then "true" else "false"}/>\n"
        else if isInt x then
          "${ind n}<integer>${toString x}</integer>\n"
        else if isString x then
          "${ind n}<string>${esc x}</string>\n"
        else if isList x then
          "${ind n}<array>\n" + concatStringsSep "" (map (go (n + 1)) x) + "${ind n}</array>\n"
        else if isAttrs x then
          "${ind n}<dict>\n"
          + concatStringsSep "" (map (k: "${ind (n + 1)}<key>${esc k}</key>\n" + go (n + 1) x.${k}) (attrNames x))
          + "${ind n}</dict>\n"
        else
          throw "toPlist: unsupported value";
    in
    ''
      <?xml version="1.0" encoding="UTF-8"?>
      <!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
      <plist version="1.0">
    ''
    + go 0 v
    + "</plist>\n";
}
