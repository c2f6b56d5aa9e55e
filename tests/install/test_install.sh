#!/usr/bin/env bash
# make install, as a user would use it: install the build into a fresh prefix,
# build examples/ against it through pkg-config alone (no path into the source
# or build tree), run the example on the installed built-in model, and check
# its greedy reply equals the installed binary's for the same chat.
#   test_install.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$(realpath "$1")
src=$(realpath "$2")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix

# `make install PREFIX=...` itself where the build is the Makefile's (its set-up and build
# steps taken as done: this tree is built); cmake's install of the same build otherwise
if [ "$build" = "$src/build" ]; then
  make -s -C "$src" -o setup -o build install PREFIX="$prefix" >"$tmp/install.log"
else
  cmake --install "$build" --prefix "$prefix" >"$tmp/install.log"
fi
for f in bin/hearth include/hearth.h share/hearth/models/default/config.json; do
  [ -e "$prefix/$f" ] || { echo "FAIL: make install did not install $f"; exit 1; }
done
pc=$(find "$prefix" -name hearth.pc)
lib=$(find "$prefix" -name libhearth.a)
[ -n "$pc" ] && [ -n "$lib" ] || { echo "FAIL: no hearth.pc / libhearth.a under $prefix"; exit 1; }
echo "installed: $(cd "$prefix" && find . -type f | sort | tr '\n' ' ')"

# The pkg-config file is relocatable: its paths point into this prefix.
export PKG_CONFIG_PATH=$(dirname "$pc")
incdir=$(pkg-config --variable=includedir hearth)
[ "$(realpath "$incdir")" = "$(realpath "$prefix/include")" ] || { echo "FAIL: includedir $incdir"; exit 1; }
echo "pkg-config --libs hearth: $(pkg-config --libs hearth)"

# The example, built by its own Makefile out of tree.
mkdir "$tmp/ex"
make -s -C "$tmp/ex" -f "$src/examples/Makefile" VPATH="$src/examples" >"$tmp/make.log" 2>&1 || {
  cat "$tmp/make.log"; echo "FAIL: examples/ did not build against the installed library"; exit 1; }

model=$prefix/share/hearth/models/default
prompt='Tell me about the sea.'
"$tmp/ex/complete" "$model" "$prompt" 16 >"$tmp/example.out" 2>"$tmp/example.err" || {
  cat "$tmp/example.err"; echo "FAIL: the example exited $?"; exit 1; }
cat "$tmp/example.err"

# The installed binary finds the installed built-in model by itself.
"$prefix/bin/hearth" generate --chat --temp 0 -n 16 --prompt "$prompt" >"$tmp/cli.out" 2>"$tmp/cli.err" || {
  cat "$tmp/cli.err"; echo "FAIL: installed hearth generate"; exit 1; }
if ! diff <(tr -d '\n' <"$tmp/example.out") <(tr -d '\n' <"$tmp/cli.out") >/dev/null; then
  echo "FAIL: the example's reply differs from hearth generate's"
  echo "example: $(cat "$tmp/example.out")"
  echo "cli:     $(cat "$tmp/cli.out")"
  exit 1
fi
[ -s "$tmp/example.out" ] || { echo "FAIL: empty reply"; exit 1; }
echo "reply: $(cat "$tmp/example.out")"
echo "PASS"
