#!/usr/bin/env bash
# Decode and prefill of a mixture-of-experts model on the GPU, against the
# active-bytes roofline (the bytes a decoded token reads at the device's
# copy bandwidth).
#
#   bench/cuda/moe.sh [HEARTH]          (default HEARTH: build-gpu/hearth)
#
# 1. makes random-weight qwen3moe GGUFs in Qwen3-30B-A3B's geometry (see
#    tools/gen_random_gguf.c: 4 layers of 128 experts, 8 used, FFN 768,
#    hidden 2048, vocabulary 32000 unless LAYERS / EXPERTS / VOCAB say
#    otherwise), one per type in $TYPES, into $BENCH_DIR (default
#    /tmp/hearth-bench-moe), unless they are there;
# 2. prints the bytes a decoded token reads (every non-expert matrix once,
#    one embedding row, experts_used / experts of each expert stack);
# 3. runs `hearth bench --device cuda -p $P -n $N --repeat $R --roofline`
#    on each, and the same decode with every kernel launched
#    (HEARTH_CUDA_GRAPHS=0), and prints tg tokens/s x active bytes as a share
#    of the copy bandwidth the bench measured.
# Environment: P (512), N (128), R (3), TYPES ("q8_0 q4_0"), LAYERS, EXPERTS,
# VOCAB, SHAPE (a3b; moe-tiny for a quick check of the script), DEVICE (cuda;
# cpu runs the same on the host).
set -euo pipefail
cd "$(dirname "$0")/../.."
h=${1:-build-gpu/hearth}
P=${P:-512} N=${N:-128} R=${R:-3} TYPES=${TYPES:-"q8_0 q4_0"} SHAPE=${SHAPE:-a3b} DEVICE=${DEVICE:-cuda}
d=${BENCH_DIR:-/tmp/hearth-bench-moe}
mkdir -p "$d"
cc -O2 -o "$d/gen_random_gguf" tools/gen_random_gguf.c -lm
over=() tag=$SHAPE
if [ -n "${LAYERS:-}${EXPERTS:-}${VOCAB:-}" ]; then
  over=("${LAYERS:-4}" "${EXPERTS:-128}" "${VOCAB:-32000}")
  tag="$SHAPE-l${over[0]}-e${over[1]}-v${over[2]}"
fi
for t in $TYPES; do
  f="$d/qwen3moe-$tag-$t.gguf"
  [ -s "$f" ] || "$d/gen_random_gguf" "$f" "$t" "$SHAPE" "${over[@]}"
  read -r active total < <(python3 - "$f" <<'PY'
import struct, sys
f = open(sys.argv[1], "rb")
def u32(): return struct.unpack("<I", f.read(4))[0]
def u64(): return struct.unpack("<Q", f.read(8))[0]
def s(): return f.read(u64()).decode()
size = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
def val(t):
    if t == 8: return s()
    if t == 9:
        et, n = u32(), u64()
        return [val(et) for _ in range(n)] if et in (8, 9) else f.read(size[et] * n) and None
    raw = f.read(size[t])
    return struct.unpack({4: "<I", 5: "<i", 6: "<f", 10: "<Q", 11: "<q"}.get(t, "<%dB" % size[t]), raw)[0]
assert f.read(4) == b"GGUF" and u32() == 3
nt, nkv = u64(), u64()
kv = {}
for _ in range(nkv):
    k = s(); kv[k] = val(u32())
arch = kv["general.architecture"]
used, experts = kv[arch + ".expert_used_count"], kv[arch + ".expert_count"]
per32 = {0: 128, 1: 64, 2: 18, 8: 34}  # F32, F16, Q4_0, Q8_0: bytes per 32 values
active = total = 0
for _ in range(nt):
    name = s(); nd = u32(); dims = [u64() for _ in range(nd)]; ty = u32(); u64()
    n = 1
    for x in dims: n *= x
    nbytes = n * per32[ty] // 32
    total += nbytes
    if "_exps." in name: active += nbytes * used // experts
    elif name == "token_embd.weight": active += nbytes // dims[1]
    else: active += nbytes
print(active, total)
PY
)
  echo "== $t: $(basename "$f"): $total bytes, $active read per decoded token"
  out=$("$h" bench --model "$f" --device "$DEVICE" -p "$P" -n "$N" --repeat "$R" --roofline)
  echo "$out" | grep -E '^(pp|tg)'
  tg=$(echo "$out" | awk '/^tg/ {print $2}')
  bw=$(echo "$out" | sed -n 's/.*of the \([0-9.]*\) GB\/s copy bandwidth.*/\1/p')
  [ -z "$bw" ] || python3 -c "print(f'decode: {$active / 1e9:.3f} GB x {$tg} tokens/s = {$active * $tg / 1e9:.0f} GB/s, {100 * $active * $tg / 1e9 / $bw:.1f}% of the {$bw} GB/s copy bandwidth')"
  [ "$DEVICE" = cpu ] || echo "without CUDA graphs: $(HEARTH_CUDA_GRAPHS=0 "$h" bench --model "$f" --device "$DEVICE" -p 0 -n "$N" --repeat "$R" | grep -E '^tg')"
done
