#!/usr/bin/env bash
# Installs what hearth needs to build and test on Debian 12, and nothing it
# already has. Safe to run again: a machine that has everything does nothing.
#   tools/setup.sh          build dependencies, and the chat page's libraries
#                           (npm, when there is npm and a network; optional)
#   tools/setup.sh --test   also the test dependencies (clang fuzzing runtime,
#                           node + npm for the client tests, chromium for the
#                           chat page's browser test, the load generator
#                           bench/serve_load, which a test runs, heif-enc for
#                           the HEIC / AVIF images the media test makes,
#                           gnuplot for `hearth train`'s loss curve, which a
#                           test draws)
#   tools/setup.sh --bench  the test dependencies (gnuplot draws the benchmarks' plots) and
#                           OpenBLAS, the BLAS of Debian's python3-torch in
#                           bench/cpu/train.sh's peer (else it runs on the
#                           reference BLAS, many times slower)
#   tools/setup.sh --gguf-parity   only what tools/gen_gguf_parity.sh needs: llama.cpp's
#                           converter on Debian's torch, and a C++ compiler for its CPU build
set -euo pipefail

need=(cmake make gcc pkg-config libjansson-dev libpcre2-dev libutf8proc-dev libmicrohttpd-dev libedit-dev
      libjpeg62-turbo-dev libpng-dev libwebp-dev libgif-dev libcurl4-openssl-dev libssl-dev
      libavformat-dev libavcodec-dev libswresample-dev libswscale-dev libavutil-dev libheif-dev libgit2-dev)
if [ "${1:-}" = "--test" ] || [ "${1:-}" = "--bench" ]; then
  need+=(clang libclang-rt-14-dev python3 python3-jinja2 nodejs npm chromium libheif-examples gnuplot-nox)
fi
if [ "${1:-}" = "--bench" ]; then
  need+=(libopenblas0-pthread)
fi
if [ "${1:-}" = "--gguf-parity" ]; then
  need=(cmake make gcc g++ git npm python3-torch python3-numpy python3-sentencepiece python3-yaml python3-tqdm)
fi

missing=()
for p in "${need[@]}"; do
  # A package counts as present when dpkg says so, or (for tools that may have
  # come from elsewhere, like node or python3) when the command is on PATH.
  if dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then continue; fi
  case "$p" in
    nodejs) command -v node >/dev/null && continue ;;
    npm) command -v npm >/dev/null && continue ;;
    python3) command -v python3 >/dev/null && continue ;;
    python3-jinja2) python3 -c 'import jinja2' 2>/dev/null && continue ;;
    clang) command -v clang >/dev/null && continue ;;
    cmake) command -v cmake >/dev/null && continue ;;
  esac
  missing+=("$p")
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

[ "${1:-}" = "--gguf-parity" ] && exit 0

# The chat page's libraries from npm, bundled into the binary by the build.
# Never fails: offline or without npm, the page keeps its plain renderer.
"$(dirname "$0")/fetch_page_deps.sh"
