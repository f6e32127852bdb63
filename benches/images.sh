#!/usr/bin/env bash
# The cost of an image on the load harness (issue 41), as a ratio against a text-only chat
# measured in the same run.
#
# For each image part of a chat to a vision model kvgate decodes a prefix of the base64
# `data:` URL, reads the image header, computes the image's tokens as the model's processor
# does, expands the chat template's placeholder into that many pad tokens and counts the
# expanded prompt. This measures what that adds per request and per image.
#
# One engine of the vision model (`kvgate mock-engine --vision qwen2_5_vl` when the binary's
# mock takes --vision, else `kvgate sim-engine --vision qwen2_5_vl`, unpaced: both answer
# with the prompt_tokens of their own, independent image counting, and kvgate's guard
# refuses an answer whose prompt_tokens differ from kvgate's count, so a 200 proves the two
# agree) and one kvgate in front of it (a model with [models.vision] family = "qwen2_5_vl",
# Qwen2.5-VL-7B-Instruct's preprocessor_config.json, one unified sglang pool, an API key,
# exact admission, guard, leak detection by default, audit sink none).
#
# Bodies (the same system and user text, max_tokens 8; images before the text):
#   text      the text only
#   png1      + one 640x480 PNG (data URL)
#   jpeg1     + one 1920x1080 JPEG (tests/vision/images/jpeg_1920x1080.jpg)
#   png4      + four distinct 640x480 PNGs
# The PNGs are generated here (zlib, struct): random 2x2 blocks of colour (PNG_BLOCK), so
# they compress about as badly as a photo; their bytes are in the table.
#
# First every body is sent once through kvgate (must be 200; its usage.prompt_tokens and
# the engine's own count, direct, are printed). Then, interleaved over ROUNDS rounds, for
# each body (engine and kvgate started afresh, one warm-up request each: the simulated
# engine keeps a log of every request it received, bodies included): wrk (CONNECTIONS connections, DURATION) straight to the engine (direct) and
# through kvgate, req/s, and kvgate's CPU µs per request (utime + stime from
# /proc/<pid>/stat over the run / requests). Printed, medians over rounds: req/s direct and
# through kvgate, their ratio, kvgate's CPU µs/req, and the µs per image over text:
# (µs/req of the body − µs/req of the text body) / images.
# Machines here are noisy: read ratios within one run, never absolute numbers across runs.
#
#   apt-get install -y wrk
#   KVGATE_BIN=/tmp/kvgate bash benches/images.sh
#   KVGATE_BIN=/tmp/kvgate DURATION=10s ROUNDS=5 CONNECTIONS=32 bash benches/images.sh
#
# KVGATE_BIN is required (a built binary: this script runs no cargo build).
# Not part of `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-5s}
ROUNDS=${ROUNDS:-3}
CONNECTIONS=${CONNECTIONS:-16}
PNG_BLOCK=${PNG_BLOCK:-2}
BIN=${KVGATE_BIN:?KVGATE_BIN must name a built kvgate binary (this script does not build one)}
for tool in wrk python3 curl; do
  command -v "$tool" >/dev/null || { echo "$tool is missing: apt-get install -y wrk"; exit 1; }
done
MODEL=qwen2.5-vl
TOKENIZER=$PWD/config/tokenizers/qwen2_5_vl/tokenizer.json
CHAT_TEMPLATE=$PWD/config/tokenizers/qwen2_5_vl/tokenizer_config.json
PREPROCESSOR=$PWD/config/vision/Qwen2.5-VL-7B-Instruct/preprocessor_config.json
JPEG=$PWD/tests/vision/images/jpeg_1920x1080.jpg
KEY=kvgate-images-key
BODIES="text png1 jpeg1 png4"
WORK=$(mktemp -d)
cleanup() {
  for p in "$WORK"/*.pid; do [ -f "$p" ] && kill "$(cat "$p")" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_http() { for _ in $(seq 200); do curl -sf "$1" >/dev/null && return 0; sleep 0.1; done; echo "not up: $1"; exit 1; }

# 1. The bodies.
python3 - "$WORK" "$JPEG" "$MODEL" "$PNG_BLOCK" <<'PY'
import base64, json, random, struct, sys, zlib
work, jpeg, model, block = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])

def png(width, height, seed):
    """An RGB PNG of random block x block squares of colour (seeded: distinct per seed)."""
    rnd = random.Random(seed)
    rows = []
    for _ in range(0, height, block):
        row = b"\x00" + b"".join(bytes(rnd.getrandbits(8) for _ in range(3)) * block
                                 for _ in range(0, width, block))
        rows += [row[: 1 + 3 * width]] * block
    raw = b"".join(rows[:height])
    def chunk(kind, data):
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))
    return (b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))

def data_url(mime, data):
    return f"data:{mime};base64," + base64.b64encode(data).decode()

pngs = [data_url("image/png", png(640, 480, seed)) for seed in range(1, 5)]
jpg = data_url("image/jpeg", open(jpeg, "rb").read())
text = "Describe what you see, and how it bears on paged KV caches and admission control. " * 8

def chat(urls):
    parts = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    parts.append({"type": "text", "text": text})
    return {"model": model, "max_tokens": 8, "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": parts}]}

bodies = {"text": [], "png1": pngs[:1], "jpeg1": [jpg], "png4": pngs}
for name, urls in bodies.items():
    with open(f"{work}/{name}.json", "w") as f:
        json.dump(chat(urls), f)
    with open(f"{work}/{name}.images", "w") as f:
        f.write(str(len(urls)))
PY

# 2. The engine (the mock when it takes --vision, else the simulated engine, unpaced) and
#    kvgate in front of it, started afresh for every (round, body): the simulated engine
#    keeps every request it received (its test log, bodies included), so under wrk with
#    megabyte bodies it grows by about a body per request.
if "$BIN" mock-engine --help 2>/dev/null | grep -q -- '--vision'; then
  ENGINE_KIND=mock-engine
  ENGINE_ARGS=()
else
  ENGINE_KIND=sim-engine
  ENGINE_ARGS=(--kv-tokens 400000 --context-length 32768)
fi
KEY_SHA=$(printf %s "$KEY" | sha256sum | cut -d' ' -f1)
stop_stack() {
  local name
  for name in kvgate engine; do
    [ -f "$WORK/$name.pid" ] || continue
    kill "$(cat "$WORK/$name.pid")" 2>/dev/null || true
    wait "$(cat "$WORK/$name.pid")" 2>/dev/null || true
    rm -f "$WORK/$name.pid"
  done
}
start_stack() {
  ENGINE_PORT=$(free_port)
  "$BIN" "$ENGINE_KIND" --listen "127.0.0.1:$ENGINE_PORT" --model "$MODEL" --tokenizer "$TOKENIZER" \
    --vision qwen2_5_vl "${ENGINE_ARGS[@]}" >"$WORK/engine.log" 2>&1 &
  echo $! >"$WORK/engine.pid"
  wait_http "http://127.0.0.1:$ENGINE_PORT/health"
  PORT=$(free_port)
  ADMIN=$(free_port)
  cat >"$WORK/kvgate.toml" <<TOML
[server]
listen = "127.0.0.1:$PORT"
admin_listen = "127.0.0.1:$ADMIN"
[audit]
sink = "none"
[[models]]
name = "$MODEL"
tokenizer = "$TOKENIZER"
chat_template = "$CHAT_TEMPLATE"
context_window = 32768
[models.vision]
family = "qwen2_5_vl"
preprocessor_config = "$PREPROCESSOR"
[[pools]]
name = "vision"
model = "$MODEL"
engine = "sglang"
mode = "unified"
workers = [{ url = "http://127.0.0.1:$ENGINE_PORT", kv_tokens = 400000 }]
[[tenants]]
name = "images"
api_key_sha256 = ["$KEY_SHA"]
TOML
  RUST_LOG=error "$BIN" serve --config "$WORK/kvgate.toml" >"$WORK/kvgate.log" 2>&1 &
  echo $! >"$WORK/kvgate.pid"
  for _ in $(seq 200); do
    curl -sf "http://127.0.0.1:$ADMIN/health" >/dev/null && break
    kill -0 "$(cat "$WORK/kvgate.pid")" 2>/dev/null || { echo "kvgate did not start: $(tail -n 5 "$WORK/kvgate.log")"; exit 1; }
    sleep 0.1
  done
  curl -sf "http://127.0.0.1:$ADMIN/health" >/dev/null || { echo "kvgate not up: $(tail -n 5 "$WORK/kvgate.log")"; exit 1; }
  # Ready: the pool's worker discovered and eligible.
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$ADMIN/ready" >/dev/null && break; sleep 0.1; done
}
start_stack

base_of() { case $1 in direct) echo "http://127.0.0.1:$ENGINE_PORT" ;; kvgate) echo "http://127.0.0.1:$PORT" ;; esac; }
post() { # target body → "code prompt_tokens", the answer in $WORK/out
  local code
  code=$(curl -s -o "$WORK/out" -w '%{http_code}' "$(base_of "$1")/v1/chat/completions" \
    -H 'content-type: application/json' -H "authorization: Bearer $KEY" --data-binary @"$WORK/$2.json")
  echo "$code $(python3 -c 'import json,sys
try: print(json.load(open(sys.argv[1]))["usage"]["prompt_tokens"])
except Exception: print("-")' "$WORK/out")"
}

# 4. Every body once through kvgate: 200, and its prompt tokens (the engine's own, direct).
echo "engine: kvgate $ENGINE_KIND --vision qwen2_5_vl; kvgate: $BIN"
: >"$WORK/tokens"
for body in $BODIES; do
  read -r code tokens < <(post kvgate "$body")
  if [ "$code" != 200 ]; then
    echo "$body through kvgate answered $code: $(head -c 2000 "$WORK/out")"
    echo "kvgate log: $(tail -n 5 "$WORK/kvgate.log")"
    exit 1
  fi
  read -r dcode dtokens < <(post direct "$body")
  [ "$dcode" = 200 ] || { echo "$body direct answered $dcode: $(head -c 2000 "$WORK/out")"; exit 1; }
  echo "$body: HTTP $code through kvgate, usage.prompt_tokens $tokens (engine direct: $dtokens), $(wc -c <"$WORK/$body.json") bytes"
  echo "$body $tokens $(wc -c <"$WORK/$body.json") $(cat "$WORK/$body.images")" >>"$WORK/tokens"
done

cat >"$WORK/post.lua" <<'LUA'
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer " .. os.getenv("KEY")
local f = io.open(os.getenv("BODY"), "r")
wrk.body = f:read("*a")
f:close()
LUA
export KEY

# 5. Closed-loop throughput, interleaved rounds; kvgate's CPU per request.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
: >"$WORK/wrk"
run_wrk() { # target body
  local before after out pid
  pid=$(cat "$WORK/$([ "$1" = direct ] && echo engine || echo kvgate).pid")
  before=$(cpu_ticks "$pid")
  out=$(BODY="$WORK/$2.json" wrk -t2 -c"$CONNECTIONS" -d"$DURATION" -s "$WORK/post.lua" "$(base_of "$1")/v1/chat/completions")
  after=$(cpu_ticks "$pid")
  echo "$out" | awk -v target="$1" -v body="$2" -v cpu=$((after - before)) -v hz="$(getconf CLK_TCK)" '
    /Requests\/sec/ {rps=$2} /requests in/ {n=$1} /Non-2xx/ {bad=$NF} /Socket errors/ {sock=1}
    END {printf "%s %s %s %.1f %s %d\n", target, body, rps, (n > 0 ? cpu / hz * 1e6 / n : 0), (bad == "" ? 0 : bad), sock}' >>"$WORK/wrk"
}
stop_stack
for _ in $(seq "$ROUNDS"); do
  for body in $BODIES; do
    start_stack
    # One warm-up request to each (and a last check that both still answer 200).
    for target in direct kvgate; do
      read -r code _ < <(post "$target" "$body")
      [ "$code" = 200 ] || { echo "$body via $target answered $code: $(head -c 2000 "$WORK/out")"; exit 1; }
    done
    run_wrk direct "$body"
    run_wrk kvgate "$body"
    stop_stack
  done
done

python3 - "$WORK" "$BODIES" "$CONNECTIONS" "$DURATION" <<'PY'
import statistics, sys
work, bodies, connections, duration = sys.argv[1], sys.argv[2].split(), sys.argv[3], sys.argv[4]
med = statistics.median
tokens, size, images = {}, {}, {}
for line in open(f"{work}/tokens"):
    body, t, b, n = line.split()
    tokens[body], size[body], images[body] = int(t), int(b), int(n)
runs = {}
for line in open(f"{work}/wrk"):
    target, body, rps, cpu, bad, sock = line.split()
    runs.setdefault((target, body), []).append((float(rps), float(cpu), int(bad), int(sock)))
rounds = len(runs[("kvgate", "text")])
print(f"{rounds} interleaved wrk rounds of {duration}, {connections} connections, medians; "
      f"CPU µs/req: kvgate's utime+stime over the run / requests")
head = (f"{'body':<7}{'images':>7}{'KB':>7}{'prompt tok':>11}{'image tok':>10}{'direct req/s':>13}"
        f"{'kvgate req/s':>13}{'kvgate/direct':>14}{'kvgate µs/req':>14}{'µs/image over text':>19}{'errors':>7}")
print(head)
text_cpu = med([r[1] for r in runs[("kvgate", "text")]])
for body in bodies:
    d, k = runs[("direct", body)], runs[("kvgate", body)]
    drps, krps, kcpu = med([r[0] for r in d]), med([r[0] for r in k]), med([r[1] for r in k])
    per_image = f"{(kcpu - text_cpu) / images[body]:.0f}" if images[body] else "-"
    errors = sum(r[2] for r in d + k)
    print(f"{body:<7}{images[body]:>7}{size[body] / 1024:>7.0f}{tokens[body]:>11}"
          f"{tokens[body] - tokens['text']:>10}{drps:>13.0f}{krps:>13.0f}{krps / drps:>14.3f}"
          f"{kcpu:>14.0f}{per_image:>19}{errors:>7}")
print("image tok: prompt tokens over the text body's (pad tokens plus each image's "
      "<|vision_start|> and <|vision_end|>); errors: wrk's non-2xx answers, both targets.")
print("per round (target body, req/s / CPU µs per request of the process measured: the engine for direct, kvgate for kvgate):")
for (target, body), rs in runs.items():
    print(f"  {target:<7}{body:<7}" + "  ".join(f"{r[0]:.0f}/{r[1]:.0f}" for r in rs))
PY
