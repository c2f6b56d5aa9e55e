#!/usr/bin/env bash
# Builds bench/tokenizer/tok_bench against a build folder's static libraries.
#   bench/tokenizer/build.sh [BUILD_DIR]   (default: build)  -> BUILD_DIR/tok_bench
set -euo pipefail
cd "$(dirname "$0")/../.."
b=${1:-build}
cc -O2 -std=gnu17 -Iinclude -Isrc bench/tokenizer/tok_bench.c -o "$b/tok_bench" \
  "$b/libhearth_tokenizer.a" "$b/libhearth_format.a" "$b/libhearth_base.a" \
  $(pkg-config --libs jansson libpcre2-8 libutf8proc) -lpthread -lm
echo "$b/tok_bench"
