# Checks flake.lock against flake.nix without a store or network (what CI
# can do with Debian's nix-bin): the root node's inputs are exactly the
# flake's inputs, every input is a github input whose `original` says what
# its url says, and whose `locked` pins a full commit (rev) of the same
# repository. Nix treats such a github input as locked (a rev; the narHash
# is optional while trust-tarballs-from-git-forges holds), so the lock can
# be written without downloading nixpkgs. Evaluates to the list of
# problems ([] when the lock is good).
let
  flake = import ../../flake.nix;
  lock = builtins.fromJSON (builtins.readFile ../../flake.lock);
  names = builtins.attrNames flake.inputs;
  root = lock.nodes.${lock.root};
  lockedNames = builtins.attrNames (root.inputs or { });
  isRev = r: builtins.isString r && builtins.match "[0-9a-f]{40}" r != null;
  check =
    name:
    let
      url = flake.inputs.${name}.url or "";
      m = builtins.match "github:([^/]+)/([^/]+)(/(.+))?" url;
      node = lock.nodes.${root.inputs.${name} or ""} or null;
    in
    if m == null then
      [ "input ${name}: url ${url} is not a github: url (only those are locked by revision here)" ]
    else if node == null then
      [ "input ${name}: no node in flake.lock" ]
    else
      let
        owner = builtins.elemAt m 0;
        repo = builtins.elemAt m 1;
        ref = builtins.elemAt m 3;
        o = node.original or { };
        l = node.locked or { };
      in
      (if o != { type = "github"; inherit owner repo; } // (if ref == null then { } else { inherit ref; }) then
        [ "input ${name}: flake.lock original ${builtins.toJSON o} does not match url ${url}" ]
      else
        [ ])
      ++ (if l.type or "" != "github" || l.owner or "" != owner || l.repo or "" != repo then
        [ "input ${name}: flake.lock locked ${builtins.toJSON l} is not ${owner}/${repo} on github" ]
      else
        [ ])
      ++ (if !(isRev (l.rev or null)) then [ "input ${name}: flake.lock pins no full commit (rev)" ] else [ ]);
in
(if lock.version != 7 then [ "flake.lock version ${toString lock.version}, expected 7" ] else [ ])
++ (if names != lockedNames then
  [ "flake.nix inputs ${builtins.toJSON names} but flake.lock root inputs ${builtins.toJSON lockedNames}" ]
else
  [ ])
++ builtins.concatMap check names
