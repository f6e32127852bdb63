#!/usr/bin/env python3
"""Writes a tiny Qwen3-architecture GGUF with random weights around the real Qwen3 tokenizer.

The tokenizer part follows what llama.cpp's convert_hf_to_gguf.py does for a Qwen3 checkpoint
(Qwen3Model -> Qwen2Model.set_vocab -> _set_vocab_gpt2 -> get_vocab_base), without needing
`transformers` or any weights:
  tokenizer.ggml.model = "gpt2", tokenizer.ggml.pre = "qwen2",
  the token list padded to the config's vocab_size with "[PAD<i>]" (UNUSED),
  added tokens CONTROL when special or when they look special ("<|...|>"), else USER_DEFINED,
  merges, special token ids, add_bos_token = false and the chat template read by gguf.SpecialVocab
  from tokenizer.json and tokenizer_config.json.
The network is 2 layers, hidden 64, 4 heads, 2 KV heads, head dim 16, FFN 128, tied output, with
seeded random weights: it answers garbage, fast, and tokenizes exactly like Qwen3.

Usage: tiny_model.py --tokenizer-dir config/tokenizers/qwen3 --out target/llama-cpp/tiny-qwen3.gguf
"""
import argparse
import json
import sys
from pathlib import Path

import numpy as np
import gguf

# Qwen3's config.json values where they concern the tokenizer, shrunk elsewhere.
VOCAB_SIZE = 151936  # Qwen3 config.json vocab_size (the tokenizer defines 151669 ids)
BOS_TOKEN_ID = 151643  # Qwen3 config.json bos_token_id (<|endoftext|>), never added (add_bos false)
N_EMBD = 64
N_LAYER = 2
N_HEAD = 4
N_HEAD_KV = 2
HEAD_DIM = 16
N_FF = 128
CONTEXT_LENGTH = 40960  # Qwen3 max_position_embeddings; the server's -c picks the real n_ctx
ROPE_THETA = 1000000.0
RMS_EPS = 1e-6


def looks_special(token: str) -> bool:
    # convert_hf_to_gguf's does_token_look_special, for the cases that can occur in Qwen's vocab.
    return (
        token in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
        or (token.startswith("<|") and token.endswith("|>"))
        or (token.startswith("<｜") and token.endswith("｜>"))
        or (token.startswith("<unused") and token.endswith(">"))
    )


def vocab(tokenizer_dir: Path) -> tuple[list[str], list[int]]:
    with open(tokenizer_dir / "tokenizer.json", encoding="utf-8") as f:
        tok = json.load(f)
    if tok.get("model", {}).get("type") != "BPE":
        raise SystemExit("tokenizer.json is not a BPE tokenizer")
    reverse: dict[int, str] = {i: t for t, i in tok["model"]["vocab"].items()}
    added: dict[int, dict] = {}
    for a in tok.get("added_tokens", []):
        reverse[a["id"]] = a["content"]
        added[a["id"]] = a
    if max(reverse) >= VOCAB_SIZE:
        raise SystemExit(f"token id {max(reverse)} is over vocab_size {VOCAB_SIZE}")
    tokens: list[str] = []
    types: list[int] = []
    for i in range(VOCAB_SIZE):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        elif i in added:
            token = reverse[i]
            if added[i].get("special") or looks_special(token):
                types.append(gguf.TokenType.CONTROL)
            else:
                types.append(gguf.TokenType.USER_DEFINED)
            tokens.append(token)
        else:
            tokens.append(reverse[i])
            types.append(gguf.TokenType.NORMAL)
    return tokens, types


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokenizer-dir", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--seed", type=int, default=28)
    args = p.parse_args()

    tokens, types = vocab(args.tokenizer_dir)
    special = gguf.SpecialVocab(args.tokenizer_dir, load_merges=True, n_vocab=VOCAB_SIZE)
    if not special.merges or not special.chat_template:
        raise SystemExit(f"{args.tokenizer_dir}: merges or chat template missing")

    arch = gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.QWEN3]
    w = gguf.GGUFWriter(str(args.out), arch)
    w.add_name("kvgate tiny Qwen3 (random weights)")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_context_length(CONTEXT_LENGTH)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_rope_freq_base(ROPE_THETA)
    w.add_layer_norm_rms_eps(RMS_EPS)

    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    special.special_token_ids.setdefault("bos", BOS_TOKEN_ID)
    special.add_special_token.setdefault("bos", False)
    special.add_to_gguf(w, quiet=True)

    rng = np.random.default_rng(args.seed)

    def rand(*shape: int) -> np.ndarray:
        # numpy shape is (rows, cols) = ggml's (ne1, ne0): an (out, in) matrix like PyTorch's.
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    w.add_tensor("token_embd.weight", rand(VOCAB_SIZE, N_EMBD))
    w.add_tensor("output_norm.weight", ones(N_EMBD))
    for b in range(N_LAYER):
        w.add_tensor(f"blk.{b}.attn_norm.weight", ones(N_EMBD))
        w.add_tensor(f"blk.{b}.attn_q.weight", rand(N_HEAD * HEAD_DIM, N_EMBD))
        w.add_tensor(f"blk.{b}.attn_k.weight", rand(N_HEAD_KV * HEAD_DIM, N_EMBD))
        w.add_tensor(f"blk.{b}.attn_v.weight", rand(N_HEAD_KV * HEAD_DIM, N_EMBD))
        w.add_tensor(f"blk.{b}.attn_output.weight", rand(N_EMBD, N_HEAD * HEAD_DIM))
        w.add_tensor(f"blk.{b}.attn_q_norm.weight", ones(HEAD_DIM))
        w.add_tensor(f"blk.{b}.attn_k_norm.weight", ones(HEAD_DIM))
        w.add_tensor(f"blk.{b}.ffn_norm.weight", ones(N_EMBD))
        w.add_tensor(f"blk.{b}.ffn_gate.weight", rand(N_FF, N_EMBD))
        w.add_tensor(f"blk.{b}.ffn_up.weight", rand(N_FF, N_EMBD))
        w.add_tensor(f"blk.{b}.ffn_down.weight", rand(N_EMBD, N_FF))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
