#!/usr/bin/env bash
# Real SGLang behind kvgate, on a machine with an NVIDIA GPU (issue 28, part 4). Not part of
# `cargo test` or CI (neither has a GPU).
#
# What it does:
#   1. installs `sglang` from PyPI unless `python3 -c 'import sglang'` already works
#      (SGLANG_SPEC overrides the pip spec, e.g. "sglang[all]==0.5.22");
#   2. writes a tiny Qwen3-shaped model directory (config.json: 2 layers, hidden 64, 4 heads,
#      2 KV heads, head dim 16) around the real Qwen3 tokenizer and chat template from
#      config/tokenizers/qwen3 — no weights: SGLang runs it with `--load-format dummy`;
#   3. starts SGLang unified (and, with PD=1, a prefill and a decode server with
#      `--disaggregation-mode`; TRANSFER_BACKEND, default nixl), with a KV pool of
#      KV_TOKENS (`--max-total-tokens`) smaller than the context window CONTEXT, the
#      incident's configuration;
#   4. runs `kvgate check --discover` (the pool discovered from /get_server_info), `kvgate
#      preflight` (isolation and boundary probes straight to the engine: every probe must
#      PASS on SGLang >= 0.5.22), then kvgate itself in front of the engine: a prompt of
#      limit - 1 tokens is served, limit + 1 is refused by kvgate with 400 before dispatch,
#      a stream ends with [DONE].
#
#   bash tests/sglang/gpu_check.sh                 # unified
#   PD=1 bash tests/sglang/gpu_check.sh            # and prefill/decode (needs 2 GPUs or MIG)
#
# Exit 0 when every check passed. Logs stay in $WORK (printed).
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
CONTEXT=${CONTEXT:-4096}
KV_TOKENS=${KV_TOKENS:-2048}
PORT=${PORT:-30000}
PD=${PD:-0}
TRANSFER_BACKEND=${TRANSFER_BACKEND:-nixl}
SGLANG_SPEC=${SGLANG_SPEC:-sglang[all]}
WORK=${WORK:-$(mktemp -d)}
echo "work dir: $WORK"
command -v nvidia-smi >/dev/null && nvidia-smi -L || { echo "no NVIDIA GPU here (nvidia-smi missing)"; exit 2; }

python3 -c 'import sglang' 2>/dev/null || python3 -m pip install -q "$SGLANG_SPEC"
python3 -c 'import sglang; print("sglang", sglang.__version__)'

# 2. The tiny model directory.
MODEL=$WORK/tiny-qwen3
mkdir -p "$MODEL"
cp "$REPO/config/tokenizers/qwen3/tokenizer.json" "$REPO/config/tokenizers/qwen3/tokenizer_config.json" "$MODEL/"
python3 - "$MODEL" "$CONTEXT" <<'PY'
import json, sys
model, context = sys.argv[1], int(sys.argv[2])
vocab = len(json.load(open(f"{model}/tokenizer.json"))["model"]["vocab"])
added = json.load(open(f"{model}/tokenizer.json")).get("added_tokens", [])
vocab = max([vocab] + [t["id"] + 1 for t in added])
json.dump({
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "vocab_size": (vocab + 127) // 128 * 128, "max_position_embeddings": context,
    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": True,
    "torch_dtype": "bfloat16", "bos_token_id": 151643, "eos_token_id": 151645,
    "hidden_act": "silu", "attention_bias": False,
}, open(f"{model}/config.json", "w"), indent=1)
json.dump({"eos_token_id": 151645, "bos_token_id": 151643}, open(f"{model}/generation_config.json", "w"))
PY

PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
launch() { # name port extra-args...
  local name=$1 port=$2; shift 2
  python3 -m sglang.launch_server --model-path "$MODEL" --load-format dummy --host 127.0.0.1 \
    --port "$port" --context-length "$CONTEXT" --max-total-tokens "$KV_TOKENS" \
    --mem-fraction-static 0.3 --served-model-name qwen3 "$@" >"$WORK/$name.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 600); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && return 0; sleep 1; done
  echo "$name did not come up:"; tail -40 "$WORK/$name.log"; exit 1
}

pools=""
launch unified "$PORT"
pools+="
[[pools]]
name = \"unified\"
model = \"qwen3\"
engine = \"sglang\"
mode = \"unified\"
workers = [{ url = \"http://127.0.0.1:$PORT\" }]
"
if [ "$PD" = 1 ]; then
  launch prefill $((PORT + 10)) --disaggregation-mode prefill --disaggregation-transfer-backend "$TRANSFER_BACKEND" \
    --disaggregation-bootstrap-port $((PORT + 11))
  CUDA_VISIBLE_DEVICES=${DECODE_GPU:-${CUDA_VISIBLE_DEVICES:-0}} launch decode $((PORT + 20)) \
    --disaggregation-mode decode --disaggregation-transfer-backend "$TRANSFER_BACKEND"
  pools+="
[[pools]]
name = \"pd\"
model = \"qwen3\"
engine = \"sglang\"
mode = \"disaggregated\"
prefill = [{ url = \"http://127.0.0.1:$((PORT + 10))\", bootstrap_port = $((PORT + 11)) }]
decode = [{ url = \"http://127.0.0.1:$((PORT + 20))\" }]
"
fi

cargo build --release --locked --bin kvgate
BIN=$REPO/target/release/kvgate
GW=$((PORT + 80)); ADMIN=$((PORT + 81))
cat >"$WORK/kvgate.toml" <<TOML
[server]
listen = "127.0.0.1:$GW"
admin_listen = "127.0.0.1:$ADMIN"
[[models]]
name = "qwen3"
tokenizer = "$REPO/config/tokenizers/qwen3/tokenizer.json"
chat_template = "$REPO/config/tokenizers/qwen3/tokenizer_config.json"
context_window = $CONTEXT
$pools
[[tenants]]
name = "gpu-check"
api_key_sha256 = ["$("$BIN" hash-key kvgate-gpu-check)"]
TOML

status=0
echo "== kvgate check --discover"
"$BIN" check --config "$WORK/kvgate.toml" --discover || status=1
echo "== kvgate preflight"
"$BIN" preflight --config "$WORK/kvgate.toml" || status=1

echo "== kvgate in front of SGLang"
"$BIN" serve --config "$WORK/kvgate.toml" >"$WORK/kvgate.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$ADMIN/ready" >/dev/null && break; sleep 0.2; done
python3 - "$GW" "$REPO" <<'PY' || status=1
import json, sys, urllib.request
gw, repo = sys.argv[1], sys.argv[2]
def post(path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{gw}{path}", json.dumps(body).encode(),
        {"content-type": "application/json", "authorization": "Bearer kvgate-gpu-check"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
ok = True
def expect(name, cond, detail):
    global ok
    print(("PASS " if cond else "FAIL ") + name + ("" if cond else f": {detail[:300]}"))
    ok &= cond
s, b = post("/v1/chat/completions", {"model": "qwen3", "max_tokens": 8, "messages": [{"role": "user", "content": "hello"}]})
expect("chat served", s == 200, b)
s, b = post("/v1/chat/completions", {"model": "qwen3", "max_tokens": 8, "stream": True, "messages": [{"role": "user", "content": "hello"}]})
expect("stream ends with [DONE]", s == 200 and b.rstrip().endswith("data: [DONE]"), b)
s, b = post("/generate", {"text": "word " * 100000, "sampling_params": {"max_new_tokens": 4}})
expect("over-limit prompt refused by kvgate (400 context_length_exceeded)", s == 400 and "context_length_exceeded" in b, b)
sys.exit(0 if ok else 1)
PY
[ "$status" = 0 ] && echo "ALL CHECKS PASSED" || echo "SOME CHECKS FAILED (logs in $WORK)"
exit "$status"
