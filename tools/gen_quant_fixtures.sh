#!/usr/bin/env bash
# Regenerates tests/fixtures/quants/ from llama.cpp's own quantizer: fetches
# the llama.cpp source bundled in npm node-llama-cpp (pinned), builds ggml's
# base library (CPU only, no backends, nothing else), links
# tools/gen_quant_fixtures.c against it and runs it. The fixtures are
# committed; run this only to remake them (a few minutes of compiling).
# WORK (default a temporary folder) keeps the clone and the build.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
version=3.21.1
work=${WORK:-$(mktemp -d)}
out=$root/tests/fixtures/quants
mkdir -p "$work" "$out"
if [ ! -d "$work/llama-src/ggml" ]; then
  (cd "$work" && npm pack --silent "node-llama-cpp@$version" >/dev/null && tar xzf "node-llama-cpp-$version.tgz" &&
    git clone -q package/llama/gitRelease.bundle llama-src)
fi
cmake -S "$work/llama-src" -B "$work/ggml-build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF \
  -DLLAMA_BUILD_COMMON=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=OFF -DGGML_OPENMP=OFF >/dev/null
cmake --build "$work/ggml-build" --target ggml-base -j"$(nproc)" >/dev/null
lib=$(find "$work/ggml-build" -name 'libggml-base.a' | head -n 1)
cc -O2 -std=c11 -I "$work/llama-src/ggml/include" tools/gen_quant_fixtures.c "$lib" -lm -lpthread -lstdc++ \
  -o "$work/gen_quant_fixtures"
"$work/gen_quant_fixtures" "$out"
(cd "$work/llama-src" && git rev-parse HEAD) >"$out/LLAMA_COMMIT"
echo "wrote $out (llama.cpp $(cat "$out/LLAMA_COMMIT"))"
