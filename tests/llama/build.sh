#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` from the source that the PyPI sdist of
# llama-cpp-python vendors, and writes the tiny random-weight Qwen3 model that
# tests/llama_cpp.rs serves with it. No model weights are downloaded.
#
# Everything is cached under $CARGO_TARGET_DIR/llama-cpp (default: target/llama-cpp):
#   llama_cpp_python-<version>.tar.gz   the sdist
#   src/                                the unpacked sdist
#   build/                              the cmake/ninja build directory
#   llama-server                        the binary
#   tiny-qwen3.gguf                     the model
# A second run only checks the cache and takes seconds.
#
# Needs: python3 with pip (installs cmake, ninja and gguf from PyPI when absent),
# a C/C++ compiler. Prints the binary's path and the model's path on the last two lines.
#
# Env: LLAMA_CPP_PYTHON_VERSION (default 0.3.36), LLAMA_BUILD_JOBS (default: nproc).
set -euo pipefail

repo="$(cd "$(dirname "$0")/../.." && pwd)"
version="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
target_dir="${CARGO_TARGET_DIR:-$repo/target}"
case "$target_dir" in /*) ;; *) target_dir="$repo/$target_dir" ;; esac
cache="$target_dir/llama-cpp"
sdist="$cache/llama_cpp_python-$version.tar.gz"
src="$cache/src/llama_cpp_python-$version"
build="$cache/build"
bin="$cache/llama-server"
model="$cache/tiny-qwen3.gguf"
python="${PYTHON:-python3}"
jobs="${LLAMA_BUILD_JOBS:-$(nproc 2>/dev/null || echo 2)}"

log() { echo "[llama build] $*" >&2; }
mkdir -p "$cache"

pip_install() {
  # Installs the given PyPI packages into the current python when their module is missing.
  local module="$1"; shift
  if ! "$python" -c "import $module" >/dev/null 2>&1; then
    log "pip install $*"
    "$python" -m pip install --quiet --disable-pip-version-check "$@"
  fi
}

if [ ! -x "$bin" ]; then
  if [ ! -s "$sdist" ]; then
    log "downloading the llama-cpp-python $version sdist from PyPI"
    tmp="$(mktemp -d "$cache/dl.XXXXXX")"
    "$python" -m pip download --quiet --disable-pip-version-check --no-deps \
      --no-binary llama-cpp-python --dest "$tmp" "llama-cpp-python==$version"
    downloaded=("$tmp"/*.tar.gz)
    [ -f "${downloaded[0]}" ] || { log "pip download gave no sdist"; exit 1; }
    mv "${downloaded[0]}" "$sdist"
    rm -rf "$tmp"
  fi
  if [ ! -f "$src/vendor/llama.cpp/CMakeLists.txt" ]; then
    log "unpacking $sdist"
    rm -rf "$cache/src"
    mkdir -p "$cache/src"
    tar -xzf "$sdist" -C "$cache/src"
  fi
  pip_install cmake cmake
  pip_install ninja ninja
  # The pip-installed tools live next to the python that installed them.
  PATH="$("$python" -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):$PATH"
  export PATH
  if [ ! -f "$build/build.ninja" ]; then
    log "configuring (cmake)"
    cmake -S "$src/vendor/llama.cpp" -B "$build" -G Ninja \
      -DCMAKE_BUILD_TYPE=Release \
      -DGGML_NATIVE=OFF \
      -DLLAMA_CURL=OFF \
      -DLLAMA_OPENSSL=OFF \
      -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_EXAMPLES=OFF \
      -DLLAMA_BUILD_TOOLS=ON \
      -DLLAMA_BUILD_SERVER=ON \
      -DBUILD_SHARED_LIBS=OFF >&2
  fi
  log "building llama-server with $jobs jobs (about 6.5 minutes on 2 cores)"
  start=$(date +%s)
  ninja -C "$build" -j "$jobs" llama-server >&2
  log "built in $(( $(date +%s) - start )) s"
  cp "$build/bin/llama-server" "$bin.tmp"
  mv "$bin.tmp" "$bin"
fi

if [ ! -s "$model" ] || [ "$repo/tests/llama/tiny_model.py" -nt "$model" ]; then
  pip_install gguf "gguf>=0.10"
  pip_install numpy numpy
  log "writing the tiny Qwen3 model"
  "$python" "$repo/tests/llama/tiny_model.py" \
    --tokenizer-dir "$repo/config/tokenizers/qwen3" --out "$model.tmp" >&2
  mv "$model.tmp" "$model"
fi

"$bin" --version >/dev/null 2>&1 || { log "$bin does not run"; exit 1; }
echo "$bin"
echo "$model"
