#!/usr/bin/env bash
# The noisy-neighbour bench (issue 30): does one tenant flooding a saturated fleet hurt the
# others, and does the gateway share the fleet by weight? One run, one simulated fleet
# (WORKERS `kvgate sim-engine` unified workers, a small KV pool, a real pace and a prefill
# cost, so it saturates at a known rate), one kvgate per phase in front of it, phases one
# after another with the fleet idle between (its /v1/loads polled until nothing runs or
# waits):
#   baseline    the light tenant alone through the gateway (scheduling off): its TTFT
#   today       every tenant, no [scheduling] (enabled = false where the binary knows it)
#   scheduling  every tenant, [scheduling] enabled = true and per-tenant weights; skipped
#               ("skipped: this binary has no [scheduling]") when `kvgate check` refuses it
# Tenants (benches/noisy_neighbour.py; every request a streamed chat of a distinct prompt of
# PROMPT_WORDS words (a few hundred tokens) and MAX_TOKENS new tokens, TTFT = time to the
# first content event at the client):
#   flood   open loop at FLOOD_X × the fleet's capacity (weight 1)
#   light   open loop at LIGHT_X × the fleet's capacity (weight 1)
#   eq1..eq3  closed loops, CLOSED_K streams in flight each (weight 1)
#   w2, w1    closed loops, CLOSED_K in flight each (weight 2 and 1)
# The fleet's capacity (req/s) is computed from its sizes: per worker
# floor(KV_TOKENS / pages(prompt + MAX_TOKENS)) requests at once (or MAX_RUNNING), each
# taking FIRST_TOKEN_MS + prompt × PREFILL_US + (MAX_TOKENS - 1) × TOKEN_LATENCY_MS; the
# prompt's tokens are read once from an engine's usage. Set CAPACITY_RPS to override.
# Reported per phase (targets beside, PASS/FAIL words): light TTFT p50/p99 and p99 against
# alone (≤ 1.5× with scheduling), each tenant's share of the tokens served in the window
# (token events received in the window, one per token) beside its weighted fair share, Jain's index
# over eq1..eq3 (≥ 0.95), w2:w1 (2 ± 10%), per tenant what came back (served = 200 and a
# complete stream, of them queued = carried `x-kvgate-queued-ms`, 429, 503 with and without
# Retry-After, other errors, hung = no complete answer within QUEUE_TIMEOUT + HUNG_MARGIN:
# must be 0), the gateway's CPU per answered request (/proc/PID/stat utime + stime), each
# engine's peak KV in use against its pool (the sim never exceeds it; reported anyway).
# Missed targets never fail the script: only harness errors exit non-zero.
# Machines here are noisy (2 shared cores run the engines, the gateway and the clients):
# read ratios within one run, never absolute numbers across runs.
#
#   bash benches/noisy_neighbour.sh                        # release build, DURATION=60
#   DURATION=20 KVGATE_BIN=/path/to/kvgate bash benches/noisy_neighbour.sh
#
# Sizes (env, defaults): WORKERS=2 KV_TOKENS=8192 TOKEN_LATENCY_MS=20 FIRST_TOKEN_MS=30
# PREFILL_US=200 (per prompt token) MAX_RUNNING= (unset: the KV pool bounds the batch)
# PROMPT_WORDS=300 MAX_TOKENS=64 DURATION=60 (seconds per phase) FLOOD_X=5 LIGHT_X=0.1
# CLOSED_K=16 CAPACITY_RPS= (unset: computed) LIGHT_LEAD=10 (seconds the light tenant runs
# alone before the others start, as a steady user the flood arrives on; not counted; negative:
# it arrives that long after the others started, a cold newcomer, and all of it counts); scheduling: MAX_QUEUED=256 QUEUE_TIMEOUT=10
# (seconds) KV_OVERCOMMIT=1.0; HUNG_MARGIN=20 (seconds beyond QUEUE_TIMEOUT); AUDIT=stderr
# (audit lines to a file; none: off).
#
# Not part of `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."
WORKERS=${WORKERS:-2}
KV_TOKENS=${KV_TOKENS:-8192}
TOKEN_LATENCY_MS=${TOKEN_LATENCY_MS:-20}
FIRST_TOKEN_MS=${FIRST_TOKEN_MS:-30}
PREFILL_US=${PREFILL_US:-200}
MAX_RUNNING=${MAX_RUNNING:-}
PROMPT_WORDS=${PROMPT_WORDS:-300}
MAX_TOKENS=${MAX_TOKENS:-64}
DURATION=${DURATION:-60}
FLOOD_X=${FLOOD_X:-5}
LIGHT_X=${LIGHT_X:-0.1}
CLOSED_K=${CLOSED_K:-16}
LIGHT_LEAD=${LIGHT_LEAD:-10}
CAPACITY_RPS=${CAPACITY_RPS:-}
MAX_QUEUED=${MAX_QUEUED:-256}
QUEUE_TIMEOUT=${QUEUE_TIMEOUT:-10}
KV_OVERCOMMIT=${KV_OVERCOMMIT:-1.0}
HUNG_MARGIN=${HUNG_MARGIN:-20}
AUDIT=${AUDIT:-stderr}
TENANTS="flood light eq1 eq2 eq3 w2 w1"
for tool in python3 curl sha256sum; do
  command -v "$tool" >/dev/null || { echo "$tool is missing"; exit 1; }
done
if [ -n "${KVGATE_BIN:-}" ]; then
  BIN=$KVGATE_BIN
else
  cargo build --release --locked --bin kvgate >/dev/null 2>&1
  BIN=$(cd "${CARGO_TARGET_DIR:-target}" && pwd)/release/kvgate
fi
TOKENIZER=$PWD/config/tokenizers/qwen3/tokenizer.json
WORK=$(mktemp -d)
cleanup() {
  kill $(jobs -p) 2>/dev/null || true
  for p in "$WORK"/*.pid; do [ -f "$p" ] && kill "$(cat "$p")" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_up() { # url pid log
  for _ in $(seq 1200); do
    curl -sf "$1" >/dev/null && return 0
    kill -0 "$2" 2>/dev/null || { echo "did not start: $(grep -v '^$' "$3" | head -n 3)"; exit 1; }
    sleep 0.1
  done
  echo "not up: $1"; exit 1
}
weight_of() { case $1 in w2) echo 2 ;; *) echo 1 ;; esac; }

# 1. The fleet.
ENGINES="" WORKER_LINES=""
for i in $(seq "$WORKERS"); do
  port=$(free_port)
  "$BIN" sim-engine --listen "127.0.0.1:$port" --model qwen3 --tokenizer "$TOKENIZER" \
    --kv-tokens "$KV_TOKENS" --context-length "$KV_TOKENS" --token-latency-ms "$TOKEN_LATENCY_MS" \
    --first-token-ms "$FIRST_TOKEN_MS" --prefill-token-latency-us "$PREFILL_US" \
    ${MAX_RUNNING:+--max-running-requests "$MAX_RUNNING"} >"$WORK/engine$i.log" 2>&1 &
  echo $! >"$WORK/engine$i.pid"
  ENGINES="$ENGINES${ENGINES:+,}http://127.0.0.1:$port"
  WORKER_LINES="$WORKER_LINES  { url = \"http://127.0.0.1:$port\", kv_tokens = $KV_TOKENS },
"
done
i=0
for url in ${ENGINES//,/ }; do i=$((i + 1)); wait_up "$url/health" "$(cat "$WORK/engine$i.pid")" "$WORK/engine$i.log"; done

# 2. The prompt's tokens (one request straight to an engine) and the fleet's capacity.
read -r PROMPT_TOKENS CAPACITY < <(python3 - "${ENGINES%%,*}" <<PY
import json, math, sys, urllib.request
sys.path.insert(0, "benches")
import noisy_neighbour as nn
req = urllib.request.Request(sys.argv[1] + "/v1/chat/completions", data=json.dumps({
    "model": "qwen3", "max_tokens": 1,
    "messages": [{"role": "user", "content": nn.prompt("probe", 0, $PROMPT_WORDS)}]}).encode(),
    headers={"content-type": "application/json"})
prompt = json.loads(urllib.request.urlopen(req, timeout=30).read())["usage"]["prompt_tokens"]
pages = math.ceil((prompt + $MAX_TOKENS) / 16) * 16
slots = $KV_TOKENS // pages
if "$MAX_RUNNING":
    slots = min(slots, int("$MAX_RUNNING"))
service = ($FIRST_TOKEN_MS + prompt * $PREFILL_US / 1000 + ($MAX_TOKENS - 1) * $TOKEN_LATENCY_MS) / 1000
print(prompt, "${CAPACITY_RPS}" or f"{$WORKERS * slots / service:.2f}")
PY
)
[ -n "${CAPACITY:-}" ] || { echo "could not read the prompt's tokens from ${ENGINES%%,*}"; exit 1; }
FLOOD_RATE=$(python3 -c "print($FLOOD_X * $CAPACITY)")
LIGHT_RATE=$(python3 -c "print($LIGHT_X * $CAPACITY)")
CLIENT_TIMEOUT=$((QUEUE_TIMEOUT + HUNG_MARGIN))
echo "fleet: $WORKERS sim-engines, KV $KV_TOKENS tokens each, ${TOKEN_LATENCY_MS} ms/token, first token ${FIRST_TOKEN_MS} ms" \
  "+ ${PREFILL_US} µs/prompt token${MAX_RUNNING:+, max running $MAX_RUNNING}; prompt $PROMPT_TOKENS tokens, max_tokens $MAX_TOKENS;" \
  "capacity ≈ $CAPACITY req/s; $DURATION s per phase; binary $BIN"

# 3. Gateway configs: today (scheduling off), scheduling (on), and whether this binary knows the keys.
write_config() { # file listen admin mode(none|off|on)
  local t
  {
    cat <<TOML
[server]
listen = "127.0.0.1:$2"
admin_listen = "127.0.0.1:$3"
[audit]
sink = "$AUDIT"
[[models]]
name = "qwen3"
tokenizer = "$TOKENIZER"
chat_template = "$PWD/config/tokenizers/qwen3/tokenizer_config.json"
context_window = $KV_TOKENS
[[pools]]
name = "fleet"
model = "qwen3"
engine = "sglang"
mode = "unified"
workers = [
$WORKER_LINES]
TOML
    if [ "$4" != none ]; then
      cat <<TOML
[scheduling]
enabled = $([ "$4" = on ] && echo true || echo false)
max_queued = $MAX_QUEUED
queue_timeout = "${QUEUE_TIMEOUT}s"
kv_overcommit = $KV_OVERCOMMIT
TOML
    fi
    for t in $TENANTS; do
      echo "[[tenants]]"
      echo "name = \"$t\""
      echo "api_key_sha256 = [\"$(printf %s "nn-$t-key" | sha256sum | cut -d' ' -f1)\"]"
      if [ "$4" != none ]; then
        echo "weight = $(weight_of "$t")"
        echo 'priority = "standard"'
      fi
    done
  } >"$1"
}
write_config "$WORK/probe.toml" "$(free_port)" "$(free_port)" on
SCHED=1 SKIPPED=()
if ! "$BIN" check --config "$WORK/probe.toml" >"$WORK/probe.out" 2>&1; then
  SCHED=0
  SKIPPED=(--skipped "scheduling: skipped: this binary has no [scheduling] (kvgate check: $(grep -v '^$' "$WORK/probe.out" | tail -n 1))")
  write_config "$WORK/probe.toml" "$(free_port)" "$(free_port)" none
  "$BIN" check --config "$WORK/probe.toml" >"$WORK/probe.out" 2>&1 \
    || { echo "kvgate check refused the plain config: $(tail -n 3 "$WORK/probe.out")"; exit 1; }
fi

start_gateway() { # name mode → $WORK/name.{pid,port}
  local port admin pid
  port=$(free_port) admin=$(free_port)
  write_config "$WORK/$1.toml" "$port" "$admin" "$2"
  RUST_LOG=${GATEWAY_LOG:-error} "$BIN" serve --config "$WORK/$1.toml" >"$WORK/$1.log" 2>&1 &
  pid=$!
  echo "$pid" >"$WORK/$1.pid"
  for _ in $(seq 1200); do
    if curl -sf "http://127.0.0.1:$admin/health" >/dev/null; then echo "$port" >"$WORK/$1.port"; return 0; fi
    kill -0 "$pid" 2>/dev/null || { echo "kvgate $1 did not start: $(tail -n 3 "$WORK/$1.log")"; exit 1; }
    sleep 0.1
  done
  echo "kvgate $1 not up"; exit 1
}
stop() { kill "$(cat "$WORK/$1.pid")" 2>/dev/null || true; wait "$(cat "$WORK/$1.pid")" 2>/dev/null || true; rm -f "$WORK/$1.pid"; }
wait_idle() { # until no engine runs or queues a request (at most 120 s)
  python3 - "$ENGINES" <<'PY'
import json, sys, time, urllib.request
urls = sys.argv[1].split(",")
for _ in range(1200):
    busy = 0
    for u in urls:
        l = json.loads(urllib.request.urlopen(u + "/v1/loads", timeout=2).read())
        busy += l["num_running_reqs"] + l["num_waiting_reqs"]
    if busy == 0:
        sys.exit(0)
    time.sleep(0.1)
print(f"the fleet is still busy after 120 s ({busy} requests): the next phase starts anyway")
PY
}
run_phase() { # name mode tenants
  local weights="" t
  for t in $TENANTS; do weights="$weights${weights:+,}$t=$(weight_of "$t")"; done
  start_gateway "$1" "$2"
  python3 benches/noisy_neighbour.py phase --name "$1" --url "http://127.0.0.1:$(cat "$WORK/$1.port")" \
    --engines "$ENGINES" --gateway-pid "$(cat "$WORK/$1.pid")" --tenants "$3" --weights "$weights" \
    --duration "$DURATION" --flood-rate "$FLOOD_RATE" --light-rate "$LIGHT_RATE" \
    --capacity-rps "$CAPACITY" --closed-k "$CLOSED_K" --light-lead "$LIGHT_LEAD" --prompt-words "$PROMPT_WORDS" \
    --max-tokens "$MAX_TOKENS" --client-timeout "$CLIENT_TIMEOUT" --out "$WORK/$1.json" &
  echo $! >"$WORK/clients.pid"
  wait "$(cat "$WORK/clients.pid")" || { echo "the clients of $1 failed"; exit 1; }
  rm -f "$WORK/clients.pid"
  stop "$1"
  wait_idle
}
ulimit -n 65536 2>/dev/null || true
OFF=off
[ "$SCHED" = 1 ] || OFF=none
echo "phases (each $DURATION s + up to $CLIENT_TIMEOUT s for the last answers):"
run_phase baseline "$OFF" light
[ -n "${KEEP_LOGS:-}" ] && trap 'cp "$WORK"/*.log "$WORK"/*.json "$KEEP_LOGS"/ 2>/dev/null; cleanup' EXIT
[ "${SKIP_TODAY:-}" = 1 ] || run_phase today "$OFF" "${TENANTS// /,}"
VARIANTS=""
[ "${SKIP_TODAY:-}" = 1 ] || VARIANTS="$WORK/today.json"
if [ "$SCHED" = 1 ]; then
  run_phase scheduling on "${TENANTS// /,}"
  VARIANTS="$VARIANTS $WORK/scheduling.json"
fi
# shellcheck disable=SC2086 # a list of files
python3 benches/noisy_neighbour.py report --baseline "$WORK/baseline.json" "${SKIPPED[@]}" $VARIANTS
