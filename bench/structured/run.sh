#!/usr/bin/env bash
# Structured output's cost: decode speed of a grammar-constrained stream
# against an unconstrained one of the same length, same model, same seed, in
# the same run, alternating so both see the same machine. Each constrained
# case runs to the token budget (the schema leaves room for that), the free
# one with --ignore-eos; the ratio of median decode tok/s is printed per case.
#
# usage: bench/structured/run.sh [HEARTH] [MODEL] [TOKENS] [REPS]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
hearth=${1:-$here/../../build/hearth}
model=${2:-$here/../../models/default}
n=${3:-256}
reps=${4:-7}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# (a constrained run may end before the budget where the grammar allows the end
# token; the figures are rates, so that does not skew them)
# one long string: the state inside it repeats (the common case)
echo '{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}' >"$tmp/string.json"
# many short fields: the state changes at every few tokens
cat >"$tmp/records.json" <<'J'
{"type":"array","items":{"type":"object","properties":{"id":{"type":"integer","minimum":0,"maximum":9999},
"name":{"type":"string","maxLength":12},"tags":{"type":"array","items":{"enum":["a","bb","ccc"]},"maxItems":3},
"ok":{"type":"boolean"},"score":{"type":"number"}},"required":["id","name","tags","ok","score"],"additionalProperties":false}}
J
run() { # args...: prints decode tok/s
  "$hearth" generate --model "$model" --prompt "Once upon a time" -n "$n" --temp 0.8 --threads 2 --stats "$@" 2>&1 >/dev/null |
    sed -n 's/.*generated [0-9]* tokens (\([0-9.]*\) tok\/s).*/\1/p' | tail -1
}
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
for c in string records json_object; do
  : >"$tmp/free" && : >"$tmp/con"
  for r in $(seq "$reps"); do
    run --seed "$r" --ignore-eos >>"$tmp/free"
    case $c in
      json_object) run --seed "$r" --json-schema '{"type":"object"}' >>"$tmp/con" ;;
      *) run --seed "$r" --json-schema-file "$tmp/$c.json" >>"$tmp/con" ;;
    esac
  done
  f=$(median <"$tmp/free") && k=$(median <"$tmp/con")
  awk -v c="$c" -v f="$f" -v k="$k" 'BEGIN {printf "%-12s free %8.1f tok/s  constrained %8.1f tok/s  ratio %.3f\n", c, f, k, k / f}'
done

# The mask's own cost with real (large) vocabularies, when fetched into .deps
root=$here/../..
cc -O2 -std=gnu17 -I"$root/include" -I"$root/src" "$here/mask_bench.c" -o "$tmp/mask_bench" "$root/build/libhearth.a" \
  $(pkg-config --libs jansson libpcre2-8 libutf8proc) -lpthread -lm
schema='{"type":"array","items":{"type":"object","properties":{"id":{"type":"integer"},"name":{"type":"string"},"tags":{"type":"array","items":{"type":"string"}}},"required":["id","name","tags"]}}'
doc='[{"id": 1, "name": "Alice Smith", "tags": ["admin", "ops"]}, {"id": 22, "name": "Bob", "tags": []}, {"id": 333, "name": "Carol \"CJ\" Jones", "tags": ["x", "y", "z"]}]'
for tk in qwen3 llama3_1 gemma3; do
  d=$root/.deps/tokenizers/$tk
  [ -f "$d/tokenizer.json" ] && printf '%-9s ' "$tk" && "$tmp/mask_bench" "$d" "$schema" "$doc"
done
