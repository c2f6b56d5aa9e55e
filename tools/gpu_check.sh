#!/usr/bin/env bash
# gpu_check.sh — builds hearth with its CUDA backend and checks it on an NVIDIA GPU:
# the cross-backend op harness (CUDA against the CPU reference), the same
# harness under compute-sanitizer's memcheck, the golden model tests of every
# architecture on the GPU (logits against transformers, greedy ids, chunked
# and batched runs), a mixture of experts under an expert budget (the same
# logits as with every expert on the device), the paged-KV, quantized-KV and scheduler tests on the GPU (batched
# equals alone, seeded sampling on the device), `generate`, `serve` and
# `bench` on every golden model (tools/gpu_verbs.sh), `hearth bench --device cuda`
# on an 8B-shaped random bf16 model and on a Qwen3-30B-A3B-shaped mixture of
# experts (bench/cuda/moe.sh), and the refusal of that model when the
# device has too little free memory. Prints a summary table last.
#
# The GPU machine has CUDA, cmake and python3 with torch but not the -dev
# packages the host code needs (jansson, pcre2, utf8proc, libmicrohttpd), so
# the build happens on a Debian machine with the CUDA toolkit and travels:
#
#   tools/gpu_check.sh --prepare     # here: build into build-gpu/, bundle into .carry/gpu.tar.xz
#   tools/gpu_check.sh               # there, from the repository root, with .carry/gpu.tar.xz beside it
#
# The bundle is built for Hopper alone (sm_90: the H100 and H200; GPU_ARCH
# overrides), stripped and xz-compressed, so that it travels beside the
# repository in a few megabytes; it is unpacked into .carry/gpu/ there.
#
# Options on the GPU machine (environment): GPU_CHECK_BENCH=0 skips the 8B
# and MoE benchmarks (GPU_CHECK_MOE_BENCH=0 the MoE one: bench/cuda/moe.sh),
# GPU_CHECK_SANITIZER=0 skips compute-sanitizer, GPU_CHECK_TESTS="..." runs
# only the named test programs after the op harness, OUT=DIR keeps logs.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bundle="$root/.carry/gpu"
tests=(backend_test_backend_ops model_test_golden model_test_lora model_test_gguf model_test_quantized model_test_expert_budget model_test_mm_vision model_test_mm_enc model_test_tp engine_test_kv_paged engine_test_kv_quant engine_test_sched engine_test_structured engine_test_denoise engine_test_host_rows)

if [ "${1:-}" = "--prepare" ]; then
  set -e
  "$root/tools/setup.sh"
  # (no FFmpeg or libheif: their libraries would have to travel too; audio, video, HEIC and AVIF are refused there with a message)
  cmake -S "$root" -B "$root/build-gpu" -DCMAKE_BUILD_TYPE=Release -DHEARTH_CUDA=ON -DHEARTH_FFMPEG=OFF -DHEARTH_HEIF=OFF \
    -DCMAKE_CUDA_ARCHITECTURES="${GPU_ARCH:-90-real}" >/dev/null
  cmake --build "$root/build-gpu" -j "$(nproc)" --target hearth_cli hearth_cuda "${tests[@]}"
  cmake --build "$root/build-gpu" -j "$(nproc)" --target serve_load >/dev/null 2>&1 || echo "gpu_check: no serve_load (libcurl's headers: tools/setup.sh --bench)"
  rm -rf "$bundle" && mkdir -p "$bundle/lib" "$bundle/fixtures"
  cp "$root/build-gpu/hearth" "$root/build-gpu/libhearth_cuda.so" "$bundle/"
  for t in "${tests[@]}"; do cp "$root/build-gpu/tests/$t" "$bundle/"; done
  # host libraries the GPU machine lacks
  for l in libutf8proc.so.2 libmicrohttpd.so.12 libjpeg.so.62 libpng16.so.16 libwebp.so.7 libgif.so.7; do
    cp -L "/usr/lib/$(uname -m)-linux-gnu/$l" "$bundle/lib/"
  done
  echo "$root" >"$bundle/source_dir"
  # the benchmark tools: random GGUF files, the serving load generator (libcurl, where its headers are here)
  cc -O2 -o "$bundle/gen_random_gguf" "$root/tools/gen_random_gguf.c" -lm
  # the tiny llama GGUF the tests read (as ctest's fixtures.tiny_gguf writes it)
  "$root/tools/fetch_test_deps.sh"
  "$bundle/gen_random_gguf" --vocab "$root/.deps/llama.cpp/vocab/ggml-vocab-llama-spm.gguf" \
    "$bundle/fixtures/llama-2-tiny-random.gguf" f16 llama2-tiny
  if [ -x "$root/build-gpu/serve_load" ]; then cp "$root/build-gpu/serve_load" "$bundle/"; fi
  strip --strip-unneeded "$bundle"/hearth "$bundle"/libhearth_cuda.so "$bundle"/*_test_* "$bundle"/gen_random_gguf
  tar cf - -C "$root/.carry" gpu | xz -T0 -9 >"$root/.carry/gpu.tar.xz"
  rm -rf "$bundle"
  ls -la "$root/.carry/gpu.tar.xz"
  exit 0
fi

if [ ! -x "$bundle/hearth" ] && [ -f "$bundle.tar.xz" ]; then tar xJf "$bundle.tar.xz" -C "$root/.carry"; fi

[ -x "$bundle/hearth" ] || { echo "gpu_check: no bundle at $bundle (run tools/gpu_check.sh --prepare on the build machine)"; exit 2; }
export LD_LIBRARY_PATH="$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
logs=${OUT:-/tmp/gpu_check}
mkdir -p "$logs"
# The tests find their fixtures at the paths they were built with.
src=$(cat "$bundle/source_dir")
if [ "$src" != "$root" ] && [ ! -e "$src" ]; then mkdir -p "$(dirname "$src")" && ln -s "$root" "$src"; fi
if [ ! -e "$src/build-gpu/fixtures/llama-2-tiny-random.gguf" ]; then
  mkdir -p "$src/build-gpu/fixtures" && ln -s "$bundle/fixtures/llama-2-tiny-random.gguf" "$src/build-gpu/fixtures/"
fi

nvidia-smi -L || true
declare -a rows
row() { rows+=("$(printf '%-34s %-6s %s' "$1" "$2" "$3")"); }
run_test() { # name, command...
  local name=$1; shift
  local t0=$SECONDS
  if "$@" >"$logs/$name.log" 2>&1; then row "$name" PASS "$((SECONDS - t0)) s; $(tail -n 1 "$logs/$name.log")"
  else row "$name" FAIL "$((SECONDS - t0)) s; see $logs/$name.log"; tail -n 30 "$logs/$name.log"; fi
}

cd "$root"
HEARTH_TEST_REQUIRE_CUDA=1 run_test "op harness (cuda vs cpu)" "$bundle/backend_test_backend_ops"
grep -A40 "^op " "$logs/op harness (cuda vs cpu).log" | head -n 40 || true
if [ "${GPU_CHECK_SANITIZER:-1}" = 1 ]; then
  if command -v compute-sanitizer >/dev/null; then
    HEARTH_TEST_REQUIRE_CUDA=1 run_test "op harness under memcheck" compute-sanitizer --tool memcheck --error-exitcode 9 \
      --leak-check full "$bundle/backend_test_backend_ops"
  else row "op harness under memcheck" SKIP "compute-sanitizer not found"; fi
fi
for t in ${GPU_CHECK_TESTS:-model_test_golden model_test_lora model_test_gguf model_test_quantized model_test_expert_budget model_test_mm_vision model_test_mm_enc model_test_tp engine_test_kv_paged engine_test_kv_quant engine_test_sched engine_test_structured engine_test_denoise}; do
  HEARTH_TEST_DEVICE=cuda run_test "$t (cuda)" "$bundle/$t"
done
grep "max abs error" "$logs/model_test_golden (cuda).log" | head -n 40 || true
# every verb on every golden model: generate (against the CPU's ids), bench, serve
run_test "verbs on golden models (cuda)" "$root/tools/gpu_verbs.sh" "$bundle/hearth" cuda "$logs/verbs"
grep -v " PASS " "$logs/verbs on golden models (cuda).log" 2>/dev/null | head -n 20 || true

if [ "${GPU_CHECK_BENCH:-1}" = 1 ]; then
  m=/tmp/hearth-llama-3.1-8b-bf16
  [ -f "$m/config.json" ] || python3 "$root/tools/gen_random_model.py" "$m" --shape llama-3.1-8b --dtype bf16 >"$logs/gen.log" 2>&1
  if "$bundle/hearth" bench --model "$m" --device cuda -p 512 -n 128 --repeat 3 --roofline >"$logs/bench.log" 2>&1; then
    row "bench 8B bf16 (cuda)" DONE "$(grep -E '^(pp|tg)' "$logs/bench.log" | tr '\n' ' ')"
    row "  roofline" "" "$(grep roofline "$logs/bench.log")"
  else row "bench 8B bf16 (cuda)" FAIL "see $logs/bench.log"; tail -n 20 "$logs/bench.log"; fi
  cat "$logs/bench.log"
  # the same decode with every kernel launched (no recorded CUDA graphs), for comparison
  if HEARTH_CUDA_GRAPHS=0 "$bundle/hearth" bench --model "$m" --device cuda -p 0 -n 128 --repeat 3 >"$logs/bench_nographs.log" 2>&1; then
    row "  tg128 without CUDA graphs" "" "$(grep -E '^tg' "$logs/bench_nographs.log")"
  else row "bench without CUDA graphs" FAIL "see $logs/bench_nographs.log"; fi
  # a mixture of experts: a Qwen3-30B-A3B-shaped 4-layer Q8_0 GGUF, decode against the active-bytes roofline
  if [ "${GPU_CHECK_MOE_BENCH:-1}" = 1 ]; then
    if TYPES=q8_0 R=3 bash "$root/bench/cuda/moe.sh" "$bundle/hearth" >"$logs/bench_moe.log" 2>&1; then
      row "bench MoE a3b q8_0 (cuda)" DONE "$(grep -E '^(pp|tg)' "$logs/bench_moe.log" | tr '\n' ' ')"
      row "  active-bytes roofline" "" "$(grep '^decode:' "$logs/bench_moe.log")"
    else row "bench MoE a3b q8_0 (cuda)" FAIL "see $logs/bench_moe.log"; tail -n 20 "$logs/bench_moe.log"; fi
  fi
  # A model that cannot fit is refused before any upload: hold all but 4 GiB
  # of the free device memory in another process, then ask for the 16 GB model.
  if python3 - "$bundle/hearth" "$m" >"$logs/fit.log" 2>&1 <<'PY'
import subprocess, sys, torch
free, _ = torch.cuda.mem_get_info()
hold = torch.empty(free - (4 << 30), dtype=torch.uint8, device="cuda")
r = subprocess.run([sys.argv[1], "generate", "--device", "cuda", "--model", sys.argv[2], "--ids", "1,2,3", "-n", "1"],
                   capture_output=True, text=True)
print("exit", r.returncode)
print(r.stderr.strip())
sys.exit(0 if r.returncode != 0 and "the weights need" in r.stderr else 1)
PY
  then row "fit refusal (8B in 4 GiB free)" PASS "$(grep -m1 'weights need' "$logs/fit.log" | cut -c1-110)"
  else row "fit refusal (8B in 4 GiB free)" FAIL "see $logs/fit.log"; cat "$logs/fit.log"; fi
fi

echo
echo "== gpu_check summary =="
for r in "${rows[@]}"; do echo "$r"; done
! printf '%s\n' "${rows[@]}" | grep -q " FAIL "
