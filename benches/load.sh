#!/usr/bin/env bash
# The load harness: kvgate beside a bare nginx proxy, in one run, in front of the same
# mock engine (`kvgate mock-engine`: the simulated engine's exact SGLang/OpenAI shapes,
# prompt_tokens from the real tokenizer, a fixed answer cut to max_tokens, prepared once
# per distinct body, so it costs next to nothing and passes every guard check).
#
# Rows: straight to the mock (direct), nginx as a bare proxy (when installed), the HTTP
# stack's own floor (`kvgate bare-proxy`: hyper and tokio with kvgate's server and client
# settings, buffering like kvgate, no checks), kvgate with its default config (API keys,
# exact admission, guard, leak detection in block mode, audit lines to stderr, here a
# file), kvgate with leak detection off, and, with BEFORE_BIN, the same two for another
# build. AUDIT=none measures the kvgate rows without audit lines.
# Measured:
#   - closed-loop throughput (wrk, CONNECTIONS connections, ROUNDS interleaved rounds,
#     medians) and each process's CPU µs per request; the same, direct and through kvgate
#     default, when every request is a different chat (no cache helps either side: the
#     "distinct" rows); and for streamed chats (256 events each) through every target
#     (the "stream" rows);
#   - fixed-rate latency at 500 and 2,000 req/s (`kvgate load-gen`: evenly spaced
#     arrivals, latency from each request's scheduled time, so queueing shows; `hey -q`
#     fires all its workers at once), p50 and p99, and what each proxy adds over direct;
#   - streaming time to first byte and a different 100k-token chat, one request at a
#     time, medians, and what each proxy adds;
#   - the time kvgate takes to count a different 1M-token chat exactly and refuse it;
#   - peak RSS of each kvgate (and the tokenizer's own share, from a process that only
#     loads it).
#   - paced streams (last; `benches/paced_streams.py`): a mock that paces its streams like
#     an engine (`--first-token-ms FIRST_TOKEN_MS`, then one token per `--token-latency-ms`,
#     for each pace in PACES), straight (direct) and through kvgate with leak_detection =
#     off, detect, block, the binary's default (no key), strict (a row skipped when the
#     binary refuses the mode) and, with BEFORE_BIN, the old binary's default; for each
#     answer kind (the mock's `[answer:KIND]` marker: prose, code, digits, cjk; text units
#     and tokens differ between them) SAMPLES streamed chats of PACED_MAX_TOKENS tokens per
#     row, the targets side by side (PARALLEL=1: one stream at a time), every SSE event
#     timed at the client: time to first content (added to direct, p50 and p99), time to
#     the last event (added, p50), the largest gap between events (from the first content
#     on) beside direct's, errors.
#     A hold-back shows as added time to first content (≈ held tokens × pace).
# Machines here are noisy: read ratios within one run, never absolute numbers across runs.
#
#   apt-get install -y wrk nginx-light      # nginx optional: its row is skipped without it
#   bash benches/load.sh
#   DURATION=10s ROUNDS=5 bash benches/load.sh
#   BEFORE_BIN=/tmp/kvgate-old bash benches/load.sh
#   PACED_ONLY=1 bash benches/load.sh       # only the paced streams (no wrk needed), minutes
#   PACED_ONLY=1 PACES="20" SAMPLES=4 bash benches/load.sh
#   PACED=0 bash benches/load.sh            # everything but the paced streams
#   KVGATE_BIN=/tmp/kvgate bash benches/load.sh   # a built binary, no cargo build
#
# Not part of `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-5s}
AUDIT=${AUDIT:-stderr}
CONNECTIONS=${CONNECTIONS:-32}
ROUNDS=${ROUNDS:-3}
RATE_SECONDS=${RATE_SECONDS:-5}
ONE_BY_ONE=${ONE_BY_ONE:-60}
PACED_ONLY=${PACED_ONLY:-0}
PACED=${PACED:-1}
PACES=${PACES:-20 50}
FIRST_TOKEN_MS=${FIRST_TOKEN_MS:-40}
SAMPLES=${SAMPLES:-12}
PACED_MAX_TOKENS=${PACED_MAX_TOKENS:-48}
PARALLEL=${PARALLEL:-0}
TOOLS="python3 curl"
[ "$PACED_ONLY" = 1 ] || TOOLS="wrk $TOOLS"
for tool in $TOOLS; do
  command -v "$tool" >/dev/null || { echo "$tool is missing: apt-get install -y wrk"; exit 1; }
done
HAVE_NGINX=1
[ "$PACED_ONLY" = 1 ] || command -v nginx >/dev/null || { HAVE_NGINX=0; echo "nginx is missing (apt-get install -y nginx-light): its row is skipped"; }
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
  rm -rf "$WORK"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_http() { for _ in $(seq 200); do curl -sf "$1" >/dev/null && return 0; sleep 0.1; done; echo "not up: $1"; exit 1; }
start_kvgate() { # name leak_mode [binary] [engine port] → 1 when it does not come up
  local port admin pid bin=${3:-$BIN} engine=${4:-${MOCK:-}}; port=$(free_port); admin=$(free_port)
  cat >"$WORK/$1.toml" <<TOML
[server]
listen = "127.0.0.1:$port"
admin_listen = "127.0.0.1:$admin"
[audit]
sink = "$AUDIT"
[[models]]
name = "qwen3"
tokenizer = "$TOKENIZER"
chat_template = "$PWD/config/tokenizers/qwen3/tokenizer_config.json"
context_window = 131072
[[pools]]
name = "mock"
model = "qwen3"
engine = "openai"
mode = "unified"
workers = [{ url = "http://127.0.0.1:$engine", kv_tokens = 200000 }]
$( [ "$2" = default ] || echo "leak_detection = \"$2\"" )
[[tenants]]
name = "load"
api_key_sha256 = ["$("$BIN" hash-key kvgate-demo-key)"]
TOML
  RUST_LOG=error "$bin" serve --config "$WORK/$1.toml" >"$WORK/$1.log" 2>&1 &
  pid=$!
  echo "$pid" >"$WORK/$1.pid"
  for _ in $(seq 200); do
    if curl -sf "http://127.0.0.1:$admin/health" >/dev/null; then echo "$port" >"$WORK/$1.port"; return 0; fi
    kill -0 "$pid" 2>/dev/null || { rm -f "$WORK/$1.pid"; return 1; }
    sleep 0.1
  done
  echo "not up: $1"
  return 1
}

# Paced streams: for each pace, a paced mock and kvgate rows in front of it (see the top).
paced_section() {
  local pace mock name mode targets names
  for pace in $PACES; do
    mock=$(free_port)
    "$BIN" mock-engine --listen "127.0.0.1:$mock" --model qwen3 --tokenizer "$TOKENIZER" \
      --token-latency-ms "$pace" --first-token-ms "$FIRST_TOKEN_MS" >"$WORK/paced_mock.log" 2>&1 &
    echo $! >"$WORK/paced_mock.pid"
    wait_http "http://127.0.0.1:$mock/health"
    targets="direct=http://127.0.0.1:$mock" names=""
    for mode in off detect block default strict; do
      name="paced_$mode"
      if start_kvgate "$name" "$mode" "" "$mock"; then
        targets="$targets kvgate_$mode=http://127.0.0.1:$(cat "$WORK/$name.port")" names="$names $name"
      else
        echo "paced $pace ms/token: kvgate with leak_detection = \"$mode\" did not start (row skipped): $(grep -v '^$' "$WORK/$name.log" | tail -n 1)"
      fi
    done
    if [ -n "${BEFORE_BIN:-}" ]; then
      if start_kvgate paced_before default "$BEFORE_BIN" "$mock"; then
        targets="$targets before_default=http://127.0.0.1:$(cat "$WORK/paced_before.port")" names="$names paced_before"
      else
        echo "paced $pace ms/token: BEFORE_BIN did not start (row skipped): $(grep -v '^$' "$WORK/paced_before.log" | tail -n 1)"
      fi
    fi
    # shellcheck disable=SC2086 # targets and names are lists of words
    python3 benches/paced_streams.py --pace "$pace" --first-token "$FIRST_TOKEN_MS" --samples "$SAMPLES" \
      --max-tokens "$PACED_MAX_TOKENS" --parallel "$PARALLEL" $targets
    for name in $names paced_mock; do
      kill "$(cat "$WORK/$name.pid")" 2>/dev/null || true
      wait "$(cat "$WORK/$name.pid")" 2>/dev/null || true
      rm -f "$WORK/$name.pid"
    done
  done
}
if [ "$PACED_ONLY" = 1 ]; then
  paced_section
  exit 0
fi

# 1. Bodies: a 2 KB chat (plain and streamed), a 100k-token chat, a 1M-token chat.
python3 - "$WORK" <<'PY'
import json, sys
work = sys.argv[1]
user = "Explain paged KV caches and admission control in a few words. " * 30
chat = {"model": "qwen3", "max_tokens": 256, "messages": [
    {"role": "system", "content": "You are terse."}, {"role": "user", "content": user}]}
json.dump(chat, open(f"{work}/chat.json", "w"))
json.dump(dict(chat, stream=True), open(f"{work}/stream.json", "w"))
open(f"{work}/user.txt", "w").write(user)
# ≈ 100k and ≈ 1M tokens of prose; a unique first line per request keeps them distinct.
words = "the quick brown fox jumps over the lazy dog while engines page their caches ".split()
def prose(n):
    return " ".join(words[i % len(words)] + ("." if i % 17 == 16 else "") for i in range(n))
open(f"{work}/long.txt", "w").write(prose(100_000))
open(f"{work}/huge.txt", "w").write(prose(1_000_000))
PY
long_chat() { # file, unique tag → a chat body on stdout
  python3 -c 'import json,sys; print(json.dumps({"model":"qwen3","max_tokens":16,"messages":[{"role":"user","content":sys.argv[2]+"\n"+open(sys.argv[1]).read()}]}))' "$1" "$2"
}

# 2. The mock engine, nginx in front of it, kvgate in front of it.
MOCK=$(free_port)
"$BIN" mock-engine --listen "127.0.0.1:$MOCK" --model qwen3 --tokenizer "$TOKENIZER" >"$WORK/mock.log" 2>&1 &
echo $! >"$WORK/mock.pid"
wait_http "http://127.0.0.1:$MOCK/health"
ROWS="direct"
if [ "$HAVE_NGINX" = 1 ]; then
  PROXY=$(free_port)
  cat >"$WORK/proxy.conf" <<NGINX
worker_processes auto;
pid $WORK/nginx.pid;
error_log $WORK/proxy.err;
events { worker_connections 4096; }
http {
  access_log off;
  client_max_body_size 64m;
  client_body_buffer_size 8m;
  proxy_buffering off;
  proxy_request_buffering off;
  upstream engine { server 127.0.0.1:$MOCK; keepalive 64; }
  server {
    listen 127.0.0.1:$PROXY;
    location / { proxy_pass http://engine; proxy_http_version 1.1; proxy_set_header Connection ""; }
  }
}
NGINX
  nginx -p "$WORK" -c "$WORK/proxy.conf"
  ROWS="$ROWS nginx"
fi
BARE=$(free_port)
"$BIN" bare-proxy --listen "127.0.0.1:$BARE" --upstream "http://127.0.0.1:$MOCK" >"$WORK/bare.log" 2>&1 &
echo $! >"$WORK/bare.pid"
wait_http "http://127.0.0.1:$BARE/health"
ROWS="$ROWS hyper_floor"
must_start_kvgate() { start_kvgate "$@" || { echo "kvgate $1 did not start: $(tail -n 3 "$WORK/$1.log")"; exit 1; }; }
must_start_kvgate kvgate_default default
must_start_kvgate kvgate_leak_off off
KVGATE_ROWS="kvgate_default kvgate_leak_off"
if [ -n "${BEFORE_BIN:-}" ]; then
  must_start_kvgate before_default default "$BEFORE_BIN"
  must_start_kvgate before_leak_off off "$BEFORE_BIN"
  KVGATE_ROWS="$KVGATE_ROWS before_default before_leak_off"
fi
ROWS="$ROWS $KVGATE_ROWS"

base_of() {
  case $1 in
    direct) echo "http://127.0.0.1:$MOCK" ;;
    nginx) echo "http://127.0.0.1:$PROXY" ;;
    hyper_floor) echo "http://127.0.0.1:$BARE" ;;
    *) echo "http://127.0.0.1:$(cat "$WORK/$1.port")" ;;
  esac
}
pids_of() {
  case $1 in
    direct) cat "$WORK/mock.pid" ;;
    nginx) pgrep -P "$(cat "$WORK/nginx.pid")" ;;
    hyper_floor) cat "$WORK/bare.pid" ;;
    *) cat "$WORK/$1.pid" ;;
  esac
}
cpu_ticks() { local total=0 p; for p in "$@"; do [ -r "/proc/$p/stat" ] && total=$((total + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo "$total"; }
post() { # row body-file → curl's timings
  curl -s -o "$WORK/out" -w '%{http_code} %{time_starttransfer} %{time_total}\n' "$(base_of "$1")/v1/chat/completions" \
    -H 'content-type: application/json' -H 'authorization: Bearer kvgate-demo-key' --data-binary @"$2"
}
# Every target must answer 200 with the mock's answer before it is measured.
for row in $ROWS; do
  read -r code _ _ < <(post "$row" "$WORK/chat.json")
  [ "$code" = 200 ] || { echo "$row answered $code: $(head -c 400 "$WORK/out")"; exit 1; }
done

cat >"$WORK/same.lua" <<'LUA'
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer kvgate-demo-key"
local f = io.open(os.getenv("WORK") .. "/chat.json", "r")
wrk.body = f:read("*a")
f:close()
LUA
cat >"$WORK/stream.lua" <<'LUA'
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer kvgate-demo-key"
local f = io.open(os.getenv("WORK") .. "/stream.json", "r")
wrk.body = f:read("*a")
f:close()
LUA
cat >"$WORK/distinct.lua" <<'LUA'
-- A different chat each request (same length): no cache in front of the tokenizer helps.
local f = io.open(os.getenv("WORK") .. "/user.txt", "r")
local user = f:read("*a")
f:close()
local n = math.random(1, 1e9)
request = function()
  n = n + 1
  local body = '{"model":"qwen3","max_tokens":256,"messages":[{"role":"system","content":"You are terse."},'
    .. '{"role":"user","content":"' .. string.format("%010d ", n) .. user .. '"}]}'
  return wrk.format("POST", nil, {["Content-Type"] = "application/json",
    ["Authorization"] = "Bearer kvgate-demo-key"}, body)
end
LUA
export WORK

# 3. Closed-loop throughput, interleaved rounds.
: >"$WORK/wrk"
run_wrk() { # row script label
  local before after out
  before=$(cpu_ticks $(pids_of "$1"))
  out=$(wrk -t2 -c"$CONNECTIONS" -d"$DURATION" -s "$WORK/$2.lua" "$(base_of "$1")/v1/chat/completions")
  after=$(cpu_ticks $(pids_of "$1"))
  echo "$out" | awk -v row="$3" -v cpu=$((after - before)) -v hz="$(getconf CLK_TCK)" '
    /Requests\/sec/ {rps=$2} /requests in/ {n=$1} /Non-2xx/ {bad=$NF}
    END {printf "%s %s %.1f %s\n", row, rps, (n > 0 ? cpu / hz * 1e6 / n : 0), (bad == "" ? 0 : bad)}' >>"$WORK/wrk"
}
for _ in $(seq "$ROUNDS"); do
  for row in $ROWS; do run_wrk "$row" same "$row"; done
  for row in direct kvgate_default; do run_wrk "$row" distinct "${row}_distinct"; done
  for row in $ROWS; do run_wrk "$row" stream "${row}_stream"; done
done

# 4. Fixed rates (kvgate load-gen: evenly spaced arrivals, latency from the scheduled
#    send time), p50 / p99.
: >"$WORK/rate"
for rate in 500 2000; do
  for row in $ROWS; do
    read -r sent ok errors rps p50 p90 p99 max < <("$BIN" load-gen --url "$(base_of "$row")/v1/chat/completions" \
      --rate "$rate" --duration "$RATE_SECONDS" --body-file "$WORK/chat.json" \
      --header 'content-type: application/json' --header 'authorization: Bearer kvgate-demo-key')
    echo "$row $rate $rps $p50 $p99 $errors" >>"$WORK/rate"
  done
done

# 5. One request at a time: streaming first byte, a different 100k-token chat each time.
: >"$WORK/single"
for row in $ROWS; do
  for _ in $(seq "$ONE_BY_ONE"); do
    read -r code ttfb _ < <(post "$row" "$WORK/stream.json")
    echo "$row ttfb $code $ttfb" >>"$WORK/single"
  done
  for i in $(seq 5); do
    long_chat "$WORK/long.txt" "request $row $i $RANDOM" >"$WORK/long.json"
    read -r code _ total < <(post "$row" "$WORK/long.json")
    echo "$row long $code $total" >>"$WORK/single"
  done
done
# A different 1M-token chat, counted exactly and refused (context 131072).
for i in 1 2 3; do
  long_chat "$WORK/huge.txt" "huge $i $RANDOM" >"$WORK/huge.json"
  read -r code _ total < <(post kvgate_default "$WORK/huge.json")
  echo "kvgate_default huge $code $total" >>"$WORK/single"
done

# 6. Memory: each kvgate's peak, and a process that only loads the tokenizer.
RSS=""
for row in $KVGATE_ROWS; do
  RSS="$RSS $row=$(awk '/VmHWM/ {print int($2/1024)}' "/proc/$(cat "$WORK/$row.pid")/status")"
done
TOK_PORT=$(free_port)
"$BIN" mock-engine --listen "127.0.0.1:$TOK_PORT" --model qwen3 --tokenizer "$TOKENIZER" >/dev/null 2>&1 &
TOK_PID=$!
wait_http "http://127.0.0.1:$TOK_PORT/health"
TOK_RSS=$(awk '/VmHWM/ {print int($2/1024)}' "/proc/$TOK_PID/status")
kill "$TOK_PID"

python3 - "$WORK" "$RSS" "$TOK_RSS" <<'PY'
import statistics, sys
work, rss, tok_rss = sys.argv[1], sys.argv[2], sys.argv[3]
med = statistics.median
wrk = {}
for line in open(f"{work}/wrk"):
    row, rps, cpu, bad = line.split()
    wrk.setdefault(row, []).append((float(rps), float(cpu), int(bad)))
rate = {}
for line in open(f"{work}/rate"):
    row, r, rps, p50, p99, bad = line.split()
    rate[(row, int(r))] = (float(rps), float(p50), float(p99), int(bad))
single = {}
for line in open(f"{work}/single"):
    row, kind, code, t = line.split()
    single.setdefault((row, kind), []).append((code, float(t) * 1000))
direct = med([r[0] for r in wrk["direct"]])
floor = med([r[0] for r in wrk["nginx"]]) if "nginx" in wrk else None
hyper = med([r[0] for r in wrk["hyper_floor"]]) if "hyper_floor" in wrk else None
print(f"2 KB chat, 256-token answer; {len(wrk['direct'])} interleaved wrk rounds (medians), "
      f"fixed rates by kvgate load-gen; peak RSS MiB:{rss} (tokenizer alone: {tok_rss})")
print(f"{'target':<24}{'req/s':>8}{'vs nginx':>9}{'vs hyper':>9}{'vs direct':>10}{'CPU µs/req':>11}"
      f"{'+p50/+p99 @500 (ms)':>21}{'+p50/+p99 @2000':>17}{'+TTFB ms':>9}{'+100k ms':>9}{'errors':>7}")
def added(row, r):
    if (row, r) not in rate or ("direct", r) not in rate:
        return "-"
    got, base = rate[(row, r)], rate[("direct", r)]
    sat = "" if got[0] >= 0.95 * r else f" ({got[0]:.0f}/s)"
    return f"{got[1] - base[1]:+.2f}/{got[2] - base[2]:+.2f}{sat}"
def one(row, kind):
    mine, base = single.get((row, kind)), single.get(("direct", kind))
    if not mine or not base:
        return "-"
    # TTFB in hundredths of a ms: its target (0.1 ms added) is at that scale.
    digits = 2 if kind == "ttfb" else 1
    if row == "direct":
        return f"{med([t for _, t in mine]):.{digits}f}"
    return f"{med([t for _, t in mine]) - med([t for _, t in base]):+.{digits}f}"
for row, rs in wrk.items():
    rps, cpu = med([r[0] for r in rs]), med([r[1] for r in rs])
    errors = sum(r[2] for r in rs) + sum(v[3] for (n, _), v in rate.items() if n == row)
    errors += sum(1 for (n, kind), v in single.items() if n == row and kind != "huge" for c, _ in v if c != "200")
    distinct = row.endswith("_distinct")
    streamed = row.endswith("_stream")
    if distinct:
        base, vs, vh = med([r[0] for r in wrk["direct_distinct"]]), "-", "-"
    elif streamed:
        base = med([r[0] for r in wrk["direct_stream"]])
        s_floor = med([r[0] for r in wrk["nginx_stream"]]) if "nginx_stream" in wrk else None
        s_hyper = med([r[0] for r in wrk["hyper_floor_stream"]]) if "hyper_floor_stream" in wrk else None
        vs = f"{rps / s_floor:.3f}" if s_floor else "-"
        vh = f"{rps / s_hyper:.3f}" if s_hyper else "-"
    else:
        base = direct
        vs = f"{rps / floor:.3f}" if floor else "-"
        vh = f"{rps / hyper:.3f}" if hyper else "-"
    print(f"{row:<24}{rps:>8.0f}{vs:>9}{vh:>9}{rps / base:>10.3f}{cpu:>11.0f}{added(row, 500):>21}{added(row, 2000):>17}"
          f"{one(row, 'ttfb'):>9}{one(row, 'long'):>9}{errors:>7}")
huge = single.get(("kvgate_default", "huge"), [])
if huge:
    print(f"1M-token chat, counted exactly and refused by kvgate_default: {' '.join(f'{t / 1000:.2f}s ({c})' for c, t in huge)}")
print("direct row: absolute values (its TTFB and 100k columns are ms, not added); "
      "a _distinct row is compared with direct_distinct; a _stream row (streamed chats, "
      "256 events each, req/s = streams/s, CPU per stream) with the _stream rows of direct, "
      "nginx and the hyper floor.")
PY
if [ "$PACED" = 1 ]; then paced_section; fi
