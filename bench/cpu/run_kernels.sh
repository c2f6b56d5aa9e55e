#!/usr/bin/env bash
# Builds and runs bench/cpu/kernels.c (bk_matmul GEMV / GEMM rates next to
# the machine's memory bandwidth) against a build folder's static libraries.
#   bench/cpu/run_kernels.sh [BUILD_DIR] [--quick]    (default BUILD_DIR: build)
# HEARTH_CPU=scalar|avx2|avx512 picks a lower kernel level.
set -euo pipefail
cd "$(dirname "$0")/../.."
b=${1:-build}
shift || true
cmake --build "$b" --target hearth_backend -j2 >/dev/null
cc -O2 -std=gnu17 -Wall -Wextra -Werror -D_GNU_SOURCE -Iinclude -Isrc bench/cpu/kernels.c -o "$b/kernels_bench" \
  "$b/libhearth_backend.a" "$b/libhearth_base.a" $(pkg-config --libs jansson) -lpthread -lm
exec "$b/kernels_bench" "$@"
