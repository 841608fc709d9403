#!/bin/bash
# decode tok/s of SmolLM2 (cpu backend): 1 runner vs 3 tensor ranks over loopback TCP.
set -u
EXO=${EXO:-exo}
common="--backend cpu --offline --served-name m --model builtin:smollm2 --threads ${THREADS:-1}"
$EXO runner decode $common --listen 127.0.0.1:18200 > b-ref.log 2>&1 & R=$!
P=""
for r in 1 2; do $EXO runner decode $common --listen 127.0.0.1:1820$r --tensor $r/3 --tensor-peers 127.0.0.1:18210,127.0.0.1:18211,127.0.0.1:18212 > b-r$r.log 2>&1 & P="$P $!"; done
$EXO runner decode $common --listen 127.0.0.1:18203 --tensor 0/3 --tensor-peers 127.0.0.1:18210,127.0.0.1:18211,127.0.0.1:18212 > b-r0.log 2>&1 & P="$P $!"
trap "kill $R $P 2>/dev/null" EXIT
for i in $(seq 1 240); do
  a=$(curl -s -o /dev/null -w '%{http_code}' 127.0.0.1:18200/health); b=$(curl -s -o /dev/null -w '%{http_code}' 127.0.0.1:18203/health)
  [ "$a" = 200 ] && [ "$b" = 200 ] && break; sleep 0.5
done
for port in 18200 18203 18200 18203; do
  s=$(date +%s.%N)
  n=$(curl -s 127.0.0.1:$port/v1/chat/completions -H 'content-type: application/json' \
     -d '{"model":"m","messages":[{"role":"user","content":"Write a story about a cat."}],"temperature":0,"max_tokens":64,"ignore_eos":true}' | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["usage"]["completion_tokens"])')
  e=$(date +%s.%N)
  echo "port $port: $n tokens in $(echo "$e - $s" | bc) s"
done
curl -s 127.0.0.1:18203/metrics | grep '^exo_tensor_allsum'
