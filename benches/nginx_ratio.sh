#!/usr/bin/env bash
# kvgate beside nginx, in one run: a fast mock engine (nginx answering a fixed chat
# completion whose usage matches the prompt's exact count, so kvgate's guard passes it),
# nginx as a bare proxy in front of it (the floor), and kvgate in front of it with its
# default config and with the leak detector off. Closed-loop throughput with wrk, rounds
# interleaved, medians; CPU µs per request and peak RSS of each proxy. Machines here are
# noisy: read the ratios within one run, never the absolute numbers across runs.
#
#   apt-get install -y wrk nginx-light
#   bash benches/nginx_ratio.sh
#   DURATION=10s CONNECTIONS=32 ROUNDS=3 bash benches/nginx_ratio.sh
#   BEFORE_BIN=/tmp/kvgate-old bash benches/nginx_ratio.sh   # adds a row for another build
#
# Not part of `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-5s}
CONNECTIONS=${CONNECTIONS:-32}
ROUNDS=${ROUNDS:-3}
for tool in wrk nginx python3 curl; do
  command -v "$tool" >/dev/null || { echo "$tool is missing: apt-get install -y wrk nginx-light"; exit 1; }
done
cargo build --release --locked --bin kvgate >/dev/null 2>&1
BIN=$PWD/target/release/kvgate
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; for p in "$WORK"/*.pid; do [ -f "$p" ] && kill "$(cat "$p")" 2>/dev/null || true; done; rm -rf "$WORK"' EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
SIM=$(free_port); MOCK=$(free_port); PROXY=$(free_port)

# 1. The chat, and its exact prompt count (asked of the simulated engine, which counts with
#    the same tokenizer as kvgate).
python3 - "$WORK" <<'PY'
import json, sys
work = sys.argv[1]
chat = {"model": "qwen3", "max_tokens": 8, "messages": [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Explain paged KV caches and admission control in a few words. " * 30}]}
json.dump(chat, open(f"{work}/chat.json", "w"))
PY
"$BIN" sim-engine --role unified --listen "127.0.0.1:$SIM" --model qwen3 \
  --tokenizer config/tokenizers/qwen3/tokenizer.json \
  --kv-tokens 200000 --context-length 131072 >"$WORK/sim.log" 2>&1 &
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$SIM/health" >/dev/null && break; sleep 0.1; done
PROMPT_TOKENS=$(curl -sf "http://127.0.0.1:$SIM/v1/chat/completions" -H 'content-type: application/json' \
  --data @"$WORK/chat.json" | python3 -c 'import json,sys; print(json.load(sys.stdin)["usage"]["prompt_tokens"])')
kill %1 2>/dev/null || true

# 2. The mock engine and the bare proxy (two nginx instances, so CPU is told apart).
ANSWER=$(python3 - "$PROMPT_TOKENS" <<'PY'
import json, sys
n = int(sys.argv[1])
print(json.dumps({"id": "chatcmpl-mock", "object": "chat.completion", "created": 0, "model": "qwen3",
  "choices": [{"index": 0, "message": {"role": "assistant", "content": "Pages of KV, admitted before they are used. " * 20},
  "finish_reason": "stop"}],
  "usage": {"prompt_tokens": n, "completion_tokens": 8, "total_tokens": n + 8}}))
PY
)
cat >"$WORK/mock.conf" <<NGINX
worker_processes 1;
pid $WORK/mock.pid;
error_log $WORK/mock.err;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_buffer_size 64k;
  server {
    listen 127.0.0.1:$MOCK;
    location / { default_type application/json; return 200 '$ANSWER'; }
  }
}
NGINX
cat >"$WORK/proxy.conf" <<NGINX
worker_processes auto;
pid $WORK/proxy.pid;
error_log $WORK/proxy.err;
events { worker_connections 4096; }
http {
  access_log off;
  upstream engine { server 127.0.0.1:$MOCK; keepalive 64; }
  server {
    listen 127.0.0.1:$PROXY;
    location / {
      proxy_pass http://engine;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
  }
}
NGINX
nginx -p "$WORK" -c "$WORK/mock.conf"
nginx -p "$WORK" -c "$WORK/proxy.conf"

# 3. kvgate, default config and leak detection off.
start_kvgate() { # name leak_mode [binary]
  local port admin bin=${3:-$BIN}; port=$(free_port); admin=$(free_port)
  cat >"$WORK/$1.toml" <<TOML
[server]
listen = "127.0.0.1:$port"
admin_listen = "127.0.0.1:$admin"
[audit]
sink = "none"
[[models]]
name = "qwen3"
tokenizer = "$PWD/config/tokenizers/qwen3/tokenizer.json"
chat_template = "$PWD/config/tokenizers/qwen3/tokenizer_config.json"
context_window = 131072
[[pools]]
name = "mock"
model = "qwen3"
engine = "openai"
mode = "unified"
workers = [{ url = "http://127.0.0.1:$MOCK", kv_tokens = 200000 }]
leak_detection = "$2"
[[tenants]]
name = "load"
api_key_sha256 = ["$("$BIN" hash-key kvgate-demo-key)"]
TOML
  RUST_LOG=error "$bin" serve --config "$WORK/$1.toml" >"$WORK/$1.log" 2>&1 &
  echo $! >"$WORK/$1.pid"
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$admin/health" >/dev/null && break; sleep 0.1; done
  echo "$port" >"$WORK/$1.port"
}
start_kvgate kvgate_default detect
start_kvgate kvgate_leak_off off
ROWS="direct nginx kvgate_default kvgate_leak_off"
if [ -n "${BEFORE_BIN:-}" ]; then
  start_kvgate before_default detect "$BEFORE_BIN"
  start_kvgate before_leak_off off "$BEFORE_BIN"
  ROWS="$ROWS before_default before_leak_off"
fi

cat >"$WORK/post.lua" <<'LUA'
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer kvgate-demo-key"
local f = io.open(os.getenv("BODY_FILE"), "r")
wrk.body = f:read("*a")
f:close()
LUA

cpu_ticks() { # pids… → utime+stime in clock ticks, summed
  local total=0 p
  for p in "$@"; do
    [ -r "/proc/$p/stat" ] || continue
    total=$((total + $(awk '{print $14 + $15}' "/proc/$p/stat")))
  done
  echo "$total"
}
pids_of() { # name → the processes whose CPU counts for that row
  case $1 in
    direct) pgrep -P "$(cat "$WORK/mock.pid")" ;;
    nginx) pgrep -P "$(cat "$WORK/proxy.pid")" ;;
    *) cat "$WORK/$1.pid" ;;
  esac
}
url_of() {
  case $1 in
    direct) echo "http://127.0.0.1:$MOCK/v1/chat/completions" ;;
    nginx) echo "http://127.0.0.1:$PROXY/v1/chat/completions" ;;
    *) echo "http://127.0.0.1:$(cat "$WORK/$1.port")/v1/chat/completions" ;;
  esac
}
# Every target must answer 200 with the mock's body before it is measured.
for row in $ROWS; do
  code=$(curl -s -o "$WORK/check.out" -w '%{http_code}' "$(url_of "$row")" \
    -H 'content-type: application/json' -H 'authorization: Bearer kvgate-demo-key' --data @"$WORK/chat.json")
  [ "$code" = 200 ] || { echo "$row answered $code: $(head -c 400 "$WORK/check.out")"; exit 1; }
done

HZ=$(getconf CLK_TCK)
: >"$WORK/results"
for round in $(seq "$ROUNDS"); do
  for row in $ROWS; do
    before=$(cpu_ticks $(pids_of "$row"))
    out=$(BODY_FILE="$WORK/chat.json" wrk -t2 -c"$CONNECTIONS" -d"$DURATION" --latency -s "$WORK/post.lua" "$(url_of "$row")")
    after=$(cpu_ticks $(pids_of "$row"))
    echo "$out" | awk -v row="$row" -v cpu=$((after - before)) -v hz="$HZ" '
      /Requests\/sec/ {rps=$2} /^ +50%/ {p50=$2} /^ +99%/ {p99=$2}
      /requests in/ {n=$1}
      /Non-2xx/ {bad=$NF}
      END {printf "%s %s %s %s %.1f %s\n", row, rps, p50, p99, (n > 0 ? cpu / hz * 1e6 / n : 0), (bad == "" ? 0 : bad)}' >>"$WORK/results"
  done
done
RSS=""
for row in ${ROWS#direct nginx }; do
  RSS="$RSS $row=$(awk '/VmHWM/ {print int($2/1024)}' "/proc/$(cat "$WORK/$row.pid")/status")"
done
python3 - "$WORK/results" "$PROMPT_TOKENS" "$RSS" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    name, rps, p50, p99, cpu, bad = line.split()
    rows.setdefault(name, []).append((float(rps), p50, p99, float(cpu), int(bad)))
med = lambda xs: statistics.median(xs)
nginx = med([r[0] for r in rows["nginx"]])
direct = med([r[0] for r in rows["direct"]])
print(f"chat of {sys.argv[2]} prompt tokens, medians over {len(rows['nginx'])} interleaved rounds; peak RSS (MiB):{sys.argv[3]}")
print(f"{'target':<18} {'req/s':>9} {'vs nginx':>9} {'vs direct':>10} {'CPU µs/req':>11} {'p50':>9} {'p99':>9} {'non-2xx':>8}")
for name in rows:
    rs = rows[name]
    rps = med([r[0] for r in rs])
    cpu = med([r[3] for r in rs])
    last = rs[len(rs) // 2]
    print(f"{name:<18} {rps:>9.0f} {rps / nginx:>9.3f} {rps / direct:>10.3f} {cpu:>11.0f} {last[1]:>9} {last[2]:>9} {sum(r[4] for r in rs):>8}")
PY
