#!/usr/bin/env bash
# Fetches the chat page's libraries from npm (pinned versions, checked by npm
# against the registry's integrity hashes) into .deps/page/, where the build
# bundles them into the binary (cmake/embed_page.cmake): marked (GitHub-flavoured
# Markdown), DOMPurify (sanitizer), highlight.js (code), KaTeX (math, with its
# fonts inlined). Run by tools/setup.sh. Never fails the build: without npm or a
# network the page keeps its plain renderer. Skips what is already there.
set -uo pipefail
cd "$(dirname "$0")/.."
dst=.deps/page
pins="marked@15.0.12 dompurify@3.2.6 @highlightjs/cdn-assets@11.11.1 katex@0.16.22"
if [ -f "$dst/PINS" ] && [ "$(cat "$dst/PINS")" = "$pins" ]; then exit 0; fi
if ! command -v npm >/dev/null || ! command -v node >/dev/null; then
  echo "setup: no npm/node: the chat page keeps its plain renderer (tools/setup.sh --test installs them)"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! (cd "$tmp" && timeout 120 npm pack --silent --fetch-retries=1 --fetch-retry-mintimeout=2000 --fetch-retry-maxtimeout=5000 $pins >/dev/null 2>&1); then
  echo "setup: could not fetch the chat page's libraries from npm (offline?): the page keeps its plain renderer"
  exit 0
fi
for f in "$tmp"/*.tgz; do
  d="$tmp/$(basename "$f" .tgz)"
  mkdir -p "$d" && tar xzf "$f" -C "$d" || exit 0
done
out="$tmp/out"
mkdir -p "$out"
cp "$tmp"/marked-*/package/lib/marked.umd.js "$out/marked.js" &&
  cp "$tmp"/dompurify-*/package/dist/purify.min.js "$out/purify.js" &&
  cp "$tmp"/highlightjs-cdn-assets-*/package/highlight.min.js "$out/highlight.js" &&
  cp "$tmp"/highlightjs-cdn-assets-*/package/styles/github.min.css "$out/highlight.css" &&
  cp "$tmp"/highlightjs-cdn-assets-*/package/styles/github-dark.min.css "$out/highlight-dark.css" &&
  cp "$tmp"/katex-*/package/dist/katex.min.js "$out/katex.js" || { echo "setup: unexpected npm package layout"; exit 0; }
# KaTeX's stylesheet with its woff2 fonts as data: URLs (the page fetches nothing else).
node -e '
  const fs = require("fs"), path = require("path");
  const dir = process.argv[1];
  let css = fs.readFileSync(path.join(dir, "katex.min.css"), "utf8");
  css = css.replace(/src:url\(fonts\/([\w-]+)\.woff2\) format\("woff2"\)[^;}]*/g, (m, name) =>
    "src:url(data:font/woff2;base64," + fs.readFileSync(path.join(dir, "fonts", name + ".woff2")).toString("base64") + ") format(\"woff2\")");
  if (/url\(fonts\//.test(css)) throw new Error("a KaTeX font is left unresolved");
  fs.writeFileSync(process.argv[2], css);
' "$(echo "$tmp"/katex-*/package/dist)" "$out/katex.css" || { echo "setup: could not inline KaTeX's fonts"; exit 0; }
for p in marked dompurify highlightjs-cdn-assets katex; do
  for l in "$tmp/$p"-*/package/LICENSE*; do
    [ -f "$l" ] && { echo "== $p"; cat "$l"; echo; } >>"$out/LICENSES"
  done
done
echo "$pins" >"$out/PINS"
rm -rf "$dst" && mkdir -p .deps && mv "$out" "$dst"
echo "setup: the chat page's libraries are in $dst"
