#!/usr/bin/env bash
# Builds and runs bench/serve/bench_serve against a build folder's static libraries.
#   bench/serve/run.sh [BUILD_DIR] [MODEL_DIR] [THREADS] [NEW_TOKENS]
#   (defaults: build, models/default, one thread per core, 64)
set -euo pipefail
cd "$(dirname "$0")/../.."
b=${1:-build}
model=${2:-models/default}
libs=""
for l in engine chat model backend tokenizer format base; do
  [ -f "$b/libhearth_$l.a" ] && libs="$libs $b/libhearth_$l.a"
done
cc -O2 -std=gnu17 -Iinclude -Isrc bench/serve/bench_serve.c -o "$b/bench_serve" $libs \
  $(pkg-config --libs jansson libpcre2-8 libutf8proc) -lpthread -lm
"$b/bench_serve" "$model" "${3:-0}" "${4:-64}"
