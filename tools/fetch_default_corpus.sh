#!/usr/bin/env bash
# Fetches the training text of the built-in model (models/default/): the King
# James Version of the Bible (1611, public domain), from Debian's packages
# bible-kjv-text (the compressed text) and bible-kjv (the `bible` program that
# reads it). Nothing is installed: both .debs are unpacked with `dpkg -x` into a
# scratch folder and the unpacked program dumps the whole text.
#
# Writes, into .carry/corpus/ (git-ignored) or the folder given as $1:
#   kjv_verses.txt  one verse a line: "<ref><TAB><text>", e.g. "Ge1:1<TAB>In the ..."
#                   (what tools/train_default_model.py reads: chapters, verses)
#   kjv.txt         the same text as plain prose: no references, one verse a
#                   line, chapters separated by a blank line
#   SOURCE          package versions and sha256 sums of the outputs
# Skips the work when kjv_verses.txt is already there (delete it to redo).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.carry/corpus}
mkdir -p "$out"
out=$(cd "$out" && pwd)
if [ -s "$out/kjv_verses.txt" ] && [ -s "$out/kjv.txt" ]; then
  echo "corpus already in $out"
  exit 0
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

download() {
  # apt-get download needs the package lists; fetch them once if it fails.
  (cd "$tmp" && apt-get download "$@" >/dev/null 2>&1) && return 0
  apt-get update >/dev/null
  (cd "$tmp" && apt-get download "$@" >/dev/null 2>&1)
}
if ! download bible-kjv-text bible-kjv; then
  echo "fetch_default_corpus: apt-get download bible-kjv-text bible-kjv failed" >&2
  exit 1
fi
for deb in "$tmp"/*.deb; do dpkg -x "$deb" "$tmp/root"; done

bible="$tmp/root/usr/bin/bible"
if ! "$bible" -f -p "$tmp/root/usr/lib" Gen1:1 >/dev/null 2>&1; then
  echo "fetch_default_corpus: the unpacked 'bible' program does not run" \
       "(it needs libreadline8: apt-get install libreadline8)" >&2
  exit 1
fi

# -f turns pretty-printing off: one verse a line, led by its reference.
"$bible" -f -p "$tmp/root/usr/lib" Gen1:1-Rev22:21 > "$tmp/raw.txt"

# Reference and text split by a tab; collapse stray runs of spaces.
awk '{
  ref = $1; sub(/^[^ ]+ +/, ""); gsub(/ +/, " "); sub(/ +$/, "");
  if (ref !~ /^[0-9]?[A-Za-z]+[0-9]+:[0-9]+$/ || $0 == "") { bad++; next }
  print ref "\t" $0
} END { if (bad) { print "fetch_default_corpus: " bad " malformed lines" > "/dev/stderr"; exit 1 } }' \
  "$tmp/raw.txt" > "$tmp/kjv_verses.txt"

n=$(wc -l < "$tmp/kjv_verses.txt")
if [ "$n" -ne 31102 ]; then
  echo "fetch_default_corpus: expected 31102 verses, got $n" >&2
  exit 1
fi

# Plain prose: drop references; a blank line where the chapter changes.
awk -F '\t' '{
  chap = $1; sub(/:[0-9]+$/, "", chap);
  if (NR > 1 && chap != last) print "";
  print $2; last = chap
}' "$tmp/kjv_verses.txt" > "$tmp/kjv.txt"

{
  for p in bible-kjv-text bible-kjv; do
    dpkg-deb -f "$tmp"/"$p"_*.deb Package Version | paste -sd ' '
  done
  echo "license: the KJV text is public domain (translation of 1611; see the package's copyright file)"
  (cd "$tmp" && sha256sum kjv_verses.txt kjv.txt)
} > "$tmp/SOURCE"

mv "$tmp/kjv_verses.txt" "$tmp/kjv.txt" "$tmp/SOURCE" "$out"/
echo "corpus: $n verses in $out"
cat "$out/SOURCE"
