#!/usr/bin/env bash
# Plots bench/serve_load/run.sh's results: output tokens/s and time to first
# token (p50) against concurrency, one line per shape, into a PNG.
#   bench/serve_load/plot.sh RESULTS.jsonl OUT.png [TITLE]
set -euo pipefail
res=$1 png=$2 title=${3:-hearth serve}
command -v gnuplot >/dev/null || { echo "gnuplot is not installed (tools/setup.sh --bench)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 - "$res" "$tmp" <<'PY'
import json, sys, collections
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    line = line.strip()
    if not line: continue
    r = json.loads(line)
    if r.get("mode") != "closed" or r.get("ttft_ms") is None: continue
    rows[r.get("label", "?")].append((r["concurrency"], r["output_tok_s"], r["ttft_ms"]["p50"], r["ttft_ms"]["p99"]))
with open(sys.argv[2] + "/series.txt", "w") as f:
    for label, pts in rows.items():
        f.write('"%s"\n' % label)
        for p in sorted(pts): f.write("%d %.3f %.3f %.3f\n" % p)
        f.write("\n\n")
print(len(rows))
PY
n=$(grep -c '^"' "$tmp/series.txt" || true)
[ "$n" -gt 0 ] || { echo "no closed-loop points in $res" >&2; exit 1; }
cat >"$tmp/plot.gp" <<GP
set terminal pngcairo size 1100,460 font ",10"
set output "$png"
set multiplot layout 1,2 title "$title"
set logscale x 2
set key top left
set grid
set xlabel "concurrent requests"
set ylabel "output tokens/s"
plot for [i=0:$((n - 1))] "$tmp/series.txt" index i using 1:2 with linespoints title columnheader(1)
set ylabel "time to first token, p50 (ms)"
set logscale y
plot for [i=0:$((n - 1))] "$tmp/series.txt" index i using 1:3 with linespoints title columnheader(1)
unset multiplot
GP
gnuplot "$tmp/plot.gp"
echo "plot: $png"
