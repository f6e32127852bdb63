#!/usr/bin/env bash
# The prefix-routing bench (issue 31): how well does a gateway keep a tenant's long shared
# prompt and growing conversations on the worker that already holds them, and what does it
# cost? One run, rows one after another, each in front of a fresh simulated fleet (WORKERS
# `kvgate-sim` unified workers, started anew per row so every row starts with cold caches):
#   kvgate least-outstanding        kvgate as it routes today ([prefix_routing] enabled = false
#                                   where the binary knows the section)
#   kvgate cache-aware              [prefix_routing] enabled = true
#   kvgate cache-aware ×4 replicas  4 kvgate processes, one config, one salt secret; the
#                                   clients spread requests round-robin over them; each
#                                   replica routes by its own prefix index
#   kvgate cache-aware ×4 replicas, shared index   the same with [limits] backend = "redis"
#                                   (a redis-server of the bench's own): the replicas share
#                                   their prefix index through it (skipped without
#                                   redis-server)
#   smg cache_aware                 SMG (`pip install smg`) with --policy cache_aware in front
#                                   of the same fleet: no tenants, so no salt (it has none)
#   smg cache_aware + body cache_salt   the same, the client sending `cache_salt` per tenant
#                                   in the body (SMG forwards it to the workers; its routing
#                                   tree is keyed on the messages' text only)
# The cache-aware rows are skipped ("skipped: this binary has no [prefix_routing]") when
# `kvgate check` refuses the section; the SMG rows when SMG cannot be installed or started
# (the reason printed). Every kvgate row has per-tenant API keys and cache_salt = true on the
# pool, the salt secret shared by the replicas ([isolation] salt_secret_env).
# Workload (benches/prefix_routing.py, deterministic from SEED, the same token content in
# every row): TENANTS tenants with a system prompt of SYSTEM_WORDS words (≈ 1.2 tokens each;
# the first ORG_TENANTS open with one org-wide preamble of ORG_WORDS words, so a gateway
# without salts lets tenants share it), CONVERSATIONS conversations per tenant growing over
# TURNS_MIN..TURNS_MAX turns (history = the engine's real answers + USER_WORDS-word user
# messages), ONESHOT_SHARE one-shot requests, CONCURRENCY sessions in flight per tenant,
# THINK_MS between turns; streamed chats of MAX_TOKENS new tokens.
# Reported per row: prefix-cache hit rate (Σ cached / Σ prompt tokens from the engines'
# /metrics counters sglang:cached_tokens_total and sglang:prompt_tokens_total; else the
# answers' usage.prompt_tokens_details.cached_tokens; else n/a), TTFT p50/p99 (client side,
# first content event) and p50 of turns after the first, load spread max/mean over the
# workers (prompt tokens per engine from /metrics; else time-integrated in-flight requests
# from /v1/loads), the gateway's CPU per answered request (utime + stime, summed over
# replicas), then the targets: kvgate cache-aware hit rate and TTFT at least SMG's, load
# max/mean ≤ 1.3, ×4 replicas' hit rate within 5 points of ×1 (PASS/FAIL/n/a; a missed
# target never fails the script, only harness errors exit non-zero).
# Machines here are noisy (2 shared cores run the engines, the gateways and the clients):
# read ratios within one run, never absolute numbers across runs.
#
#   bash benches/prefix_routing.sh                               # release build
#   KVGATE_BIN=/path/to/kvgate SIM_BIN=/path/to/kvgate-sim bash benches/prefix_routing.sh
#   TENANTS=4 CONVERSATIONS=2 TURNS_MIN=2 TURNS_MAX=3 SYSTEM_WORDS=300 ORG_WORDS=150 bash benches/prefix_routing.sh
#
# Binaries: KVGATE_BIN (else cargo build --release), SIM_BIN (a kvgate-sim; else
# `$KVGATE_BIN sim-engine`, or the release build's kvgate-sim), SMG_BIN (else `smg` on PATH,
# else a venv at SMG_VENV with `pip install smg==SMG_VERSION`; SMG=0 skips its rows).
# Fleet (env, defaults): WORKERS=4 KV_TOKENS=65536 CONTEXT=32768 TOKEN_LATENCY_MS=20
# FIRST_TOKEN_MS=20 PREFILL_US=100 (per uncached prompt token, once the sim caches)
# MAX_RUNNING=16 SIM_ARGS= (more sim flags). Workload: SEED=31 TENANTS=16 ORG_TENANTS=8
# SYSTEM_WORDS=1400 ORG_WORDS=700 CONVERSATIONS=6 TURNS_MIN=4 TURNS_MAX=6 USER_WORDS=60
# ONESHOT_SHARE=0.2 CONCURRENCY=3 THINK_MS=300 RAMP_S=3 MAX_TOKENS=32. Gateway: REPLICAS=4
# PREFIX_SECTION=auto (auto: probe with `kvgate check`; on: always write [prefix_routing];
# off: never, and skip the cache-aware rows) PREFIX_ROUTING_KEYS= (more lines for the
# section, e.g. 'balance_margin = 0.2'), ROWS="today cache cache4 cache4-redis smg smg-salt",
# AUDIT=none.
#
# Not part of `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."
WORKERS=${WORKERS:-4}
KV_TOKENS=${KV_TOKENS:-65536}
CONTEXT=${CONTEXT:-32768}
TOKEN_LATENCY_MS=${TOKEN_LATENCY_MS:-20}
FIRST_TOKEN_MS=${FIRST_TOKEN_MS:-20}
PREFILL_US=${PREFILL_US:-100}
MAX_RUNNING=${MAX_RUNNING:-16}
SIM_ARGS=${SIM_ARGS:-}
REPLICAS=${REPLICAS:-4}
PREFIX_SECTION=${PREFIX_SECTION:-auto}
PREFIX_ROUTING_KEYS=${PREFIX_ROUTING_KEYS:-}
ROWS=${ROWS:-today cache cache4 cache4-redis smg smg-salt}
AUDIT=${AUDIT:-none}
SMG=${SMG:-1}
SMG_VERSION=${SMG_VERSION:-1.13.0}
SMG_VENV=${SMG_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kvgate-bench/smg-$SMG_VERSION}
WORKLOAD=(--seed "${SEED:-31}" --tenants "${TENANTS:-16}" --org-tenants "${ORG_TENANTS:-8}"
  --system-words "${SYSTEM_WORDS:-1400}" --org-words "${ORG_WORDS:-700}"
  --conversations "${CONVERSATIONS:-6}" --turns-min "${TURNS_MIN:-4}" --turns-max "${TURNS_MAX:-6}"
  --user-words "${USER_WORDS:-60}" --oneshot-share "${ONESHOT_SHARE:-0.2}"
  --concurrency "${CONCURRENCY:-3}" --think-ms "${THINK_MS:-300}" --ramp-s "${RAMP_S:-3}"
  --max-tokens "${MAX_TOKENS:-32}")
for tool in python3 curl sha256sum; do
  command -v "$tool" >/dev/null || { echo "$tool is missing"; exit 1; }
done
if [ -n "${KVGATE_BIN:-}" ]; then
  BIN=$KVGATE_BIN
  if [ -n "${SIM_BIN:-}" ]; then SIM=("$SIM_BIN"); else SIM=("$BIN" sim-engine); fi
else
  cargo build --release --locked --bin kvgate --bin kvgate-sim >/dev/null 2>&1
  BIN=$(cd "${CARGO_TARGET_DIR:-target}" && pwd)/release/kvgate
  SIM=("${SIM_BIN:-$(dirname "$BIN")/kvgate-sim}")
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
wait_up() { # url pid log what
  for _ in $(seq 600); do
    curl -sf "$1" >/dev/null && return 0
    kill -0 "$2" 2>/dev/null || { echo "$4 did not start: $(grep -v '^$' "$3" | tail -n 3)"; return 1; }
    sleep 0.1
  done
  echo "$4 not up after 60 s: $1"; return 1
}
TENANT_NAMES=$(python3 -c "print(' '.join(f't{i:02d}' for i in range(${TENANTS:-16})))")
export KVGATE_BENCH_SALT_SECRET=prefix-routing-bench-salt-secret

# 1. The fleet, anew for each row: $WORK/engine*.pid, ENGINES, WORKER_LINES.
start_fleet() {
  local i port
  ENGINES="" WORKER_LINES=""
  for i in $(seq "$WORKERS"); do
    port=$(free_port)
    # shellcheck disable=SC2086 # SIM_ARGS: more flags, split on spaces
    "${SIM[@]}" --listen "127.0.0.1:$port" --model qwen3 --tokenizer "$TOKENIZER" \
      --kv-tokens "$KV_TOKENS" --context-length "$CONTEXT" --token-latency-ms "$TOKEN_LATENCY_MS" \
      --first-token-ms "$FIRST_TOKEN_MS" --prefill-token-latency-us "$PREFILL_US" \
      ${MAX_RUNNING:+--max-running-requests "$MAX_RUNNING"} $SIM_ARGS >"$WORK/engine$i.log" 2>&1 &
    echo $! >"$WORK/engine$i.pid"
    ENGINES="$ENGINES${ENGINES:+,}http://127.0.0.1:$port"
    WORKER_LINES="$WORKER_LINES  { url = \"http://127.0.0.1:$port\", kv_tokens = $KV_TOKENS },
"
  done
  i=0
  for url in ${ENGINES//,/ }; do
    i=$((i + 1))
    wait_up "$url/health" "$(cat "$WORK/engine$i.pid")" "$WORK/engine$i.log" "sim engine $i" || exit 1
  done
}
stop_pid() { # file
  [ -f "$1" ] || return 0
  kill "$(cat "$1")" 2>/dev/null || true
  wait "$(cat "$1")" 2>/dev/null || true
  rm -f "$1"
}
stop_fleet() { local p; for p in "$WORK"/engine*.pid; do stop_pid "$p"; done; }

# 2. kvgate's config; mode: none (no [prefix_routing]), off, on.
write_config() { # file listen admin mode
  local t
  {
    cat <<TOML
[server]
listen = "127.0.0.1:$2"
admin_listen = "127.0.0.1:$3"
[audit]
sink = "$AUDIT"
[isolation]
salt_secret_env = "KVGATE_BENCH_SALT_SECRET"
[[models]]
name = "qwen3"
tokenizer = "$TOKENIZER"
chat_template = "$PWD/config/tokenizers/qwen3/tokenizer_config.json"
context_window = $CONTEXT
[[pools]]
name = "fleet"
model = "qwen3"
engine = "sglang"
mode = "unified"
cache_salt = true
workers = [
$WORKER_LINES]
TOML
    if [ -n "${5:-}" ]; then
      printf '[limits]\nbackend = "redis"\nredis_url = "%s"\n' "$5"
    fi
    if [ "$4" != none ]; then
      echo "[prefix_routing]"
      echo "enabled = $([ "$4" = on ] && echo true || echo false)"
      [ "$4" = on ] && [ -n "$PREFIX_ROUTING_KEYS" ] && printf '%s\n' "$PREFIX_ROUTING_KEYS"
    fi
    for t in $TENANT_NAMES; do
      echo "[[tenants]]"
      echo "name = \"$t\""
      echo "api_key_sha256 = [\"$(printf %s "pr-$t-key" | sha256sum | cut -d' ' -f1)\"]"
    done
  } >"$1"
}
# Does this binary know [prefix_routing]? (The fleet's URLs need not answer for `check`.)
WORKER_LINES="  { url = \"http://127.0.0.1:9\", kv_tokens = $KV_TOKENS },
"
PREFIX=0 PREFIX_WHY=""
case $PREFIX_SECTION in
  on) PREFIX=1 ;;
  off) PREFIX_WHY="PREFIX_SECTION=off" ;;
  *)
    write_config "$WORK/probe.toml" "$(free_port)" "$(free_port)" on
    if "$BIN" check --config "$WORK/probe.toml" >"$WORK/probe.out" 2>&1; then
      PREFIX=1
    else
      PREFIX_WHY="this binary has no [prefix_routing] (kvgate check: $(grep -v '^$' "$WORK/probe.out" | tail -n 1 | sed 's/, expected one of.*//'))"
      write_config "$WORK/probe.toml" "$(free_port)" "$(free_port)" none
      "$BIN" check --config "$WORK/probe.toml" >"$WORK/probe.out" 2>&1 \
        || { echo "kvgate check refused the plain config: $(tail -n 3 "$WORK/probe.out")"; exit 1; }
    fi
    ;;
esac
OFF=off
[ "$PREFIX" = 1 ] || OFF=none

start_kvgate() { # name mode replicas [redis-url] → $WORK/name-R.pid, URLS, PIDS
  local r port admin pid
  URLS="" PIDS=""
  for r in $(seq "$3"); do
    port=$(free_port) admin=$(free_port)
    write_config "$WORK/$1-$r.toml" "$port" "$admin" "$2" "${4:-}"
    RUST_LOG=error "$BIN" serve --config "$WORK/$1-$r.toml" >"$WORK/$1-$r.log" 2>&1 &
    pid=$!
    echo "$pid" >"$WORK/gw-$1-$r.pid"
    wait_up "http://127.0.0.1:$admin/ready" "$pid" "$WORK/$1-$r.log" "kvgate $1 replica $r" || exit 1
    URLS="$URLS${URLS:+,}http://127.0.0.1:$port"
    PIDS="$PIDS${PIDS:+,}$pid"
  done
}
stop_gateways() { local p; for p in "$WORK"/gw-*.pid; do stop_pid "$p"; done; }

# 3. SMG: SMG_BIN, `smg` on PATH, or a venv of its own (pip install smg).
SMG_CMD="" SMG_WHY=""
if [ "$SMG" = 0 ]; then
  SMG_WHY="SMG=0"
elif [ -n "${SMG_BIN:-}" ]; then
  SMG_CMD=$SMG_BIN
elif command -v smg >/dev/null; then
  SMG_CMD=$(command -v smg)
elif [ -x "$SMG_VENV/bin/smg" ]; then
  SMG_CMD=$SMG_VENV/bin/smg
elif case " $ROWS " in *" smg"*) true ;; *) false ;; esac; then
  echo "installing smg==$SMG_VERSION into $SMG_VENV (pip) ..."
  if python3 -m venv "$SMG_VENV" >"$WORK/smg-install.log" 2>&1 \
    && "$SMG_VENV/bin/pip" install -q "smg==$SMG_VERSION" >>"$WORK/smg-install.log" 2>&1; then
    SMG_CMD=$SMG_VENV/bin/smg
  else
    SMG_WHY="pip install smg==$SMG_VERSION failed: $(grep -v '^$' "$WORK/smg-install.log" | tail -n 1)"
  fi
fi
SMG_VERSION_SEEN=""
[ -z "$SMG_CMD" ] || SMG_VERSION_SEEN=$("$SMG_CMD" --version 2>/dev/null | head -n 1 || true)
start_smg() { # name → $WORK/gw-name.pid, URLS, PIDS; returns 1 (SMG_WHY set) when it cannot start
  local port prom pid n
  port=$(free_port) prom=$(free_port)
  # shellcheck disable=SC2086 # the worker URLs, one argument each
  "$SMG_CMD" launch --host 127.0.0.1 --port "$port" --prometheus-port "$prom" \
    --policy cache_aware --worker-urls ${ENGINES//,/ } --log-level warn >"$WORK/$1.log" 2>&1 &
  pid=$!
  echo "$pid" >"$WORK/gw-$1.pid"
  # Up once every worker is registered and healthy.
  for _ in $(seq 600); do
    n=$(curl -sf "http://127.0.0.1:$port/workers" 2>/dev/null \
      | python3 -c 'import json,sys; print(sum(1 for w in json.load(sys.stdin).get("workers", []) if w.get("is_healthy")))' 2>/dev/null || echo 0)
    if [ "$n" = "$WORKERS" ]; then URLS="http://127.0.0.1:$port" PIDS=$pid; return 0; fi
    if ! kill -0 "$pid" 2>/dev/null; then
      SMG_WHY="smg did not start: $(sed 's/\x1b\[[0-9;]*m//g' "$WORK/$1.log" | grep -v '^$' | tail -n 1)"
      return 1
    fi
    sleep 0.1
  done
  SMG_WHY="smg had $n of $WORKERS workers healthy after 60 s: $(sed 's/\x1b\[[0-9;]*m//g' "$WORK/$1.log" | grep -iE 'error|warn' | tail -n 1)"
  stop_pid "$WORK/gw-$1.pid"
  return 1
}

# 4. The rows.
ulimit -n 65536 2>/dev/null || true
echo "fleet per row: $WORKERS sim engines (${SIM[*]}), KV $KV_TOKENS tokens each, ${TOKEN_LATENCY_MS} ms/token," \
  "first token ${FIRST_TOKEN_MS} ms + ${PREFILL_US} µs/prompt token, max running $MAX_RUNNING${SIM_ARGS:+, $SIM_ARGS}; kvgate $BIN${SMG_CMD:+; smg $SMG_CMD ${SMG_VERSION_SEEN}}"
echo "workload: $(python3 benches/prefix_routing.py describe "${WORKLOAD[@]}")"
FILES=()
skip_row() { # id name why
  python3 -c 'import json, sys; json.dump({"name": sys.argv[2], "skipped": sys.argv[3]}, open(sys.argv[1], "w"))' \
    "$WORK/$1.json" "$2" "$3"
  FILES+=("$WORK/$1.json")
}
run_row() { # id name salt-label auth [--salt-in-body] [--note ...]
  local id=$1 name=$2 salt=$3 auth=$4
  shift 4
  python3 benches/prefix_routing.py row --name "$name" --salt "$salt" --urls "$URLS" --pids "$PIDS" \
    --engines "$ENGINES" --auth "$auth" --out "$WORK/$id.json" "${WORKLOAD[@]}" "$@" &
  echo $! >"$WORK/clients.pid"
  wait "$(cat "$WORK/clients.pid")" || { echo "the clients of $name failed"; exit 1; }
  rm -f "$WORK/clients.pid"
  FILES+=("$WORK/$id.json")
}
for row in $ROWS; do
  case $row in
    today)
      start_fleet
      start_kvgate today "$OFF" 1
      run_row today "kvgate least-outstanding" "kvgate per tenant" tenant \
        --note "kvgate's routing today (most KV room, least outstanding)$([ "$OFF" = none ] && echo '; no [prefix_routing] section written (the binary has none)')"
      ;;
    cache | cache4)
      name="kvgate cache-aware" replicas=1
      [ "$row" = cache ] || { name="kvgate cache-aware ×$REPLICAS replicas" replicas=$REPLICAS; }
      [ "$PREFIX" = 1 ] || { skip_row "$row" "$name" "$PREFIX_WHY"; continue; }
      start_fleet
      start_kvgate "$row" on "$replicas"
      run_row "$row" "$name" "kvgate per tenant" tenant \
        ${PREFIX_ROUTING_KEYS:+--note "[prefix_routing] ${PREFIX_ROUTING_KEYS//$'\n'/, }"}
      ;;
    cache4-redis)
      name="kvgate cache-aware ×$REPLICAS replicas, shared index"
      [ "$PREFIX" = 1 ] || { skip_row "$row" "$name" "$PREFIX_WHY"; continue; }
      command -v redis-server >/dev/null || { skip_row "$row" "$name" "no redis-server"; continue; }
      rport=$(free_port)
      redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no >"$WORK/redis.log" 2>&1 &
      echo $! >"$WORK/redis.pid"
      for _ in $(seq 100); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.1; done
      start_fleet
      start_kvgate "$row" on "$REPLICAS" "redis://127.0.0.1:$rport/0"
      run_row "$row" "$name" "kvgate per tenant" tenant \
        --note "[limits] backend = redis: the replicas share their prefix index (batched every 250 ms)"
      stop_gateways
      stop_pid "$WORK/redis.pid"
      stop_fleet
      continue
      ;;
    smg | smg-salt)
      name="smg cache_aware" salt="none (SMG has no tenants)" extra=()
      if [ "$row" = smg-salt ]; then
        name="smg cache_aware + body cache_salt" salt="client's, per tenant" extra=(--salt-in-body)
      fi
      [ -n "$SMG_CMD" ] || { skip_row "$row" "$name" "$SMG_WHY"; continue; }
      start_fleet
      if ! start_smg "$row"; then skip_row "$row" "$name" "$SMG_WHY"; stop_fleet; continue; fi
      run_row "$row" "$name" "$salt" none "${extra[@]}" \
        --note "the same token content, no API key; $([ "$row" = smg ] && echo 'no salt reaches the engines, so tenants share the org preamble'"'"'s cache entries (kvgate'"'"'s salted rows never can)' || echo 'the client sends cache_salt = salt-<tenant>, which SMG forwards; its tree routes on the text alone')"
      ;;
    *) echo "unknown row $row (rows: today cache cache4 cache4-redis smg smg-salt)"; exit 1 ;;
  esac
  stop_gateways
  stop_fleet
done
python3 benches/prefix_routing.py report "${FILES[@]}"
