#!/usr/bin/env bash
# Load test: throughput and latency through kvgate versus straight to the same simulated
# engine (the baseline, measured in the same run), for a small chat and a long prompt.
# Prints the ratio gateway/baseline; machines here are noisy, so compare within one run.
#
#   bash benches/load.sh            # needs wrk (apt-get install -y wrk) and python3
#   DURATION=20s CONNECTIONS=32 bash benches/load.sh
#   LEAK=off bash benches/load.sh   # the pool's leak_detection (off | detect | block; default detect)
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-10s}
CONNECTIONS=${CONNECTIONS:-16}
command -v wrk >/dev/null || { echo "wrk is missing: apt-get install -y wrk"; exit 1; }
cargo build --release --locked --bin kvgate >/dev/null 2>&1
BIN=$PWD/target/release/kvgate
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
ENGINE=$(free_port); GATEWAY=$(free_port); ADMIN=$(free_port)

"$BIN" sim-engine --role unified --listen "127.0.0.1:$ENGINE" --model qwen3 \
  --tokenizer config/tokenizers/qwen3/tokenizer.json --kv-tokens 200000 --context-length 131072 \
  >"$WORK/engine.log" 2>&1 &
cat >"$WORK/kvgate.toml" <<TOML
[server]
listen = "127.0.0.1:$GATEWAY"
admin_listen = "127.0.0.1:$ADMIN"
[audit]
sink = "none"
[[models]]
name = "qwen3"
tokenizer = "$PWD/config/tokenizers/qwen3/tokenizer.json"
chat_template = "$PWD/config/tokenizers/qwen3/tokenizer_config.json"
context_window = 131072
[[pools]]
name = "u"
model = "qwen3"
engine = "sglang"
mode = "unified"
workers = [{ url = "http://127.0.0.1:$ENGINE" }]
leak_detection = "${LEAK:-detect}"
[[tenants]]
name = "load"
api_key_sha256 = ["$("$BIN" hash-key kvgate-demo-key)"]
TOML
# The engine must be up before the gateway discovers its capacity.
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$ENGINE/health" >/dev/null && break; sleep 0.1; done
RUST_LOG=warn "$BIN" serve --config "$WORK/kvgate.toml" >"$WORK/gateway.log" 2>&1 &
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$ADMIN/ready" >/dev/null && break; sleep 0.1; done

cat >"$WORK/post.lua" <<'LUA'
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer kvgate-demo-key"
local f = io.open(os.getenv("BODY_FILE"), "r")
wrk.body = f:read("*a")
f:close()
LUA
python3 - "$WORK" <<'PY'
import json, sys
work = sys.argv[1]
chat = {"model": "qwen3", "max_tokens": 8, "messages": [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Explain paged KV caches and admission control. " * 45}]}
long = {"text": "The gateway counts every token before the engine sees it. " * 1800, "sampling_params": {"max_new_tokens": 8}}
json.dump(chat, open(f"{work}/chat.json", "w"))
json.dump(long, open(f"{work}/long.json", "w"))
PY

run() { # url body → "req/s p50_ms p99_ms"
  BODY_FILE=$2 wrk -t2 -c"$CONNECTIONS" -d"$DURATION" --latency -s "$WORK/post.lua" "$1" |
    awk '/Requests\/sec/ {rps=$2} /^ +50%/ {p50=$2} /^ +99%/ {p99=$2} END {print rps, p50, p99}'
}
printf "%-34s %12s %10s %10s\n" case "req/s" p50 p99
for case in "chat:/v1/chat/completions:chat.json" "long-prompt:/generate:long.json"; do
  IFS=: read -r name path body <<<"$case"
  base=$(run "http://127.0.0.1:$ENGINE$path" "$WORK/$body")
  gw=$(run "http://127.0.0.1:$GATEWAY$path" "$WORK/$body")
  printf "%-34s %12s %10s %10s\n" "$name direct (baseline)" $base
  printf "%-34s %12s %10s %10s\n" "$name via kvgate" $gw
  python3 -c "import sys; b=float(sys.argv[1]); g=float(sys.argv[2]); print(f'  throughput ratio kvgate/baseline: {g/b:.3f}')" $(echo $base | cut -d' ' -f1) $(echo $gw | cut -d' ' -f1)
done
