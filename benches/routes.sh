#!/usr/bin/env bash
# Each route's cost through kvgate, against chat's, in one run: one simulated SGLang engine
# (`kvgate sim-engine`, unified, no pace), kvgate in front of it with its default checks
# (API key, exact admission, limits, guard, leak detection, audit lines to stderr, here a
# file), and for every
# route the same fixed-rate load (`kvgate load-gen`: evenly spaced arrivals, latency from
# each request's scheduled time) straight to the engine and through kvgate.
#
# Per route, printed:
#   - p50 and p99 latency, direct and through kvgate, and what kvgate adds (p50);
#   - kvgate's CPU time per request (user + system, from /proc, over the route's run);
#   - both as a ratio to chat's (the baseline measured in the same run).
# Routes: chat, completions, /generate, embeddings, rerank, score, responses, Anthropic messages
# (through kvgate only: the engine serves chat, so "direct" is the chat it becomes),
# and kvgate's own /tokenize and count_tokens (no engine: "direct" is the engine's
# /tokenize for the first; none for the second).
# Machines here are noisy: read ratios within one run, never absolute numbers across runs.
#
#   bash benches/routes.sh
#   RATE=300 SECONDS_PER_ROUTE=8 bash benches/routes.sh
#   KVGATE_BIN=target/release/kvgate bash benches/routes.sh
#
# Not part of `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=${RATE:-200}
SECONDS_PER_ROUTE=${SECONDS_PER_ROUTE:-5}
if [ -n "${KVGATE_BIN:-}" ]; then
  BIN=$KVGATE_BIN
else
  cargo build --release --locked --bin kvgate >/dev/null 2>&1
  BIN=$(cd "${CARGO_TARGET_DIR:-target}" && pwd)/release/kvgate
fi
TOKENIZER=$PWD/config/tokenizers/qwen3/tokenizer.json
WORK=$(mktemp -d)
cleanup() {
  for f in "$WORK"/*.pid; do [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_up() {
  for _ in $(seq 200); do curl -sf "$1" >/dev/null && return 0; sleep 0.1; done
  echo "not up: $1"; exit 1
}

ENGINE=$(free_port)
"$BIN" sim-engine --listen "127.0.0.1:$ENGINE" --model qwen3 --tokenizer "$TOKENIZER" \
  --kv-tokens 400000 --context-length 32768 >"$WORK/engine.log" 2>&1 &
echo $! >"$WORK/engine.pid"
wait_up "http://127.0.0.1:$ENGINE/health"

PORT=$(free_port)
ADMIN=$(free_port)
cat >"$WORK/kvgate.toml" <<TOML
[server]
listen = "127.0.0.1:$PORT"
admin_listen = "127.0.0.1:$ADMIN"
[audit]
sink = "stderr"
[[models]]
name = "qwen3"
tokenizer = "$TOKENIZER"
chat_template = "$PWD/config/tokenizers/qwen3/tokenizer_config.json"
context_window = 32768
[[pools]]
name = "sim"
model = "qwen3"
engine = "sglang"
mode = "unified"
workers = [{ url = "http://127.0.0.1:$ENGINE", kv_tokens = 400000 }]
[[tenants]]
name = "bench"
api_key_sha256 = ["$("$BIN" hash-key kvgate-demo-key)"]
TOML
RUST_LOG=error "$BIN" serve --config "$WORK/kvgate.toml" >"$WORK/kvgate.log" 2>&1 &
KVGATE_PID=$!
echo $KVGATE_PID >"$WORK/kvgate.pid"
wait_up "http://127.0.0.1:$ADMIN/ready"

# The bodies: small, realistic requests, the same for both targets.
python3 - "$WORK" <<'PY'
import json, sys
work = sys.argv[1]
q = "What does a key-value cache hold, and why does it need pages?"
doc = "A KV cache keeps the attention keys and values of earlier tokens in fixed-size pages."
bodies = {
    "chat": {"model": "qwen3", "max_tokens": 8, "messages": [{"role": "user", "content": q}]},
    "completions": {"model": "qwen3", "max_tokens": 8, "prompt": q},
    "generate": {"text": q, "sampling_params": {"max_new_tokens": 8}},
    "embeddings": {"model": "qwen3", "input": [q, doc]},
    "rerank": {"query": q, "documents": [doc, "Bananas are yellow."]},
    "score": {"query": q, "items": [" yes", " no"], "label_token_ids": [9693, 902]},
    "messages": {"model": "qwen3", "max_tokens": 8, "messages": [{"role": "user", "content": q}]},
    "tokenize": {"prompt": q},
    "count_tokens": {"model": "qwen3", "messages": [{"role": "user", "content": q}]},
    "responses": {"model": "qwen3", "input": q, "max_output_tokens": 10, "store": False},
}
for name, body in bodies.items():
    with open(f"{work}/{name}.json", "w") as f:
        json.dump(body, f)
PY

cpu_ticks() { awk '{print $14 + $15}' "/proc/$KVGATE_PID/stat"; }
HZ=$(getconf CLK_TCK)
# route  kvgate-path  direct-path (- for none)
ROUTES="chat /v1/chat/completions /v1/chat/completions
completions /v1/completions /v1/completions
generate /generate /generate
embeddings /v1/embeddings /v1/embeddings
rerank /v1/rerank /v1/rerank
score /v1/score /v1/score
messages /v1/messages /v1/chat/completions
tokenize /tokenize /tokenize
count_tokens /v1/messages/count_tokens -
responses /v1/responses /v1/responses"
load() { # url body
  "$BIN" load-gen --url "$1" --rate "$RATE" --duration "$SECONDS_PER_ROUTE" --body-file "$2" \
    --header "content-type: application/json" --header "authorization: Bearer kvgate-demo-key" \
    --header "x-api-key: kvgate-demo-key"
}
printf "%-13s %8s %8s %8s %8s %9s %10s %9s %11s\n" route direct_p50 p50 p99 errors added_p50 cpu_us/req "added/chat" "cpu/chat"
chat_added="" chat_cpu=""
while read -r name path direct; do
  body="$WORK/$name.json"
  # The messages row compares with the chat it becomes.
  direct_body=$body; [ "$name" = messages ] && direct_body="$WORK/chat.json"
  d50=-
  if [ "$direct" != - ]; then
    load "http://127.0.0.1:$ENGINE$direct" "$direct_body" >/dev/null   # warm-up
    read -r _ _ _ _ d50 _ _ _ < <(load "http://127.0.0.1:$ENGINE$direct" "$direct_body")
  fi
  load "http://127.0.0.1:$PORT$path" "$body" >/dev/null   # warm-up
  before=$(cpu_ticks)
  read -r sent ok errors _ p50 _ p99 _ < <(load "http://127.0.0.1:$PORT$path" "$body")
  after=$(cpu_ticks)
  cpu=$(python3 -c "print(f'{($after - $before) / $HZ * 1e6 / max($sent, 1):.0f}')")
  added=-
  [ "$d50" = - ] || added=$(python3 -c "print(f'{$p50 - $d50:.3f}')")
  if [ "$name" = chat ]; then chat_added=$added; chat_cpu=$cpu; fi
  ratio_added=-
  [ "$added" = - ] || ratio_added=$(python3 -c "c = float('$chat_added'); print(f'{float(\"$added\") / c:.2f}' if c > 0 else '-')")
  ratio_cpu=$(python3 -c "print(f'{$cpu / max($chat_cpu, 1):.2f}')")
  printf "%-13s %8s %8s %8s %8s %9s %10s %9s %11s\n" "$name" "$d50" "$p50" "$p99" "$errors" "$added" "$cpu" "$ratio_added" "$ratio_cpu"
done <<<"$ROUTES"
echo "rate $RATE req/s, $SECONDS_PER_ROUTE s per route and target; ms; cpu_us/req is kvgate's own (HZ=$HZ)"
