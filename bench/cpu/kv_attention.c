/* kv_attention.c — the CPU's decode attention (op_attention: one query row
 * of 32 heads over 8 KV heads) over an f32, an 8-bit, a 4-bit and an FP8 KV cache
 * at several context depths, on one thread: the time of one layer's step,
 * best of R runs (best-of, because a shared machine only ever adds time).
 * Where the rows fit the caches the dequantization is extra work; where
 * they do not, reading a quarter or a sixth of the bytes wins.
 *
 *   cmake --build build --target hearth_backend
 *   cc -O2 -std=gnu17 -D_GNU_SOURCE -Iinclude -Isrc bench/cpu/kv_attention.c -o build/kv_attention_bench \
 *     build/libhearth_backend.a build/libhearth_base.a $(pkg-config --libs jansson) -lpthread -lm
 *   build/kv_attention_bench [HEAD_DIM [REPEATS [DEPTH...]]]     (default 64 20 1024 4096 16384 65536)
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "backend/ops.h"

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static float urand(uint64_t *s) {
  *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
  return (float)((*s >> 11) * (1.0 / 9007199254740992.0)) - 0.5f;
}

int main(int argc, char **argv) {
  const int64_t hd = argc > 1 ? atoll(argv[1]) : 64, H = 32, KVH = 8, kvd = KVH * hd;
  const int reps = argc > 2 ? atoi(argv[2]) : 20;
  int64_t depths[16] = {1024, 4096, 16384, 65536};
  int nd = 4;
  if (argc > 3) {
    nd = 0;
    for (int i = 3; i < argc && nd < 16; i++) depths[nd++] = atoll(argv[i]);
  }
  printf("decode attention, 1 thread: %lld heads over %lld KV heads of %lld; ms per layer-step (best of %d)\n",
         (long long)H, (long long)KVH, (long long)hd, reps);
  printf("%8s %12s %12s %12s %12s\n", "depth", "f32", "q8", "q4", "fp8");
  uint64_t seed = 0x9E3779B97F4A7C15ull;
  float *q = bk_alloc((size_t)(H * hd)), *o = bk_alloc((size_t)(H * hd)), *row = bk_alloc((size_t)kvd);
  for (int64_t i = 0; i < H * hd; i++) q[i] = urand(&seed);
  attn_params p = {H, KVH, hd, 0.125f, 0, 0};
  for (int di = 0; di < nd; di++) {
    int64_t n = depths[di], qr = n - 1;
    printf("%8lld", (long long)n);
    for (int f = BK_KV_F32; f <= BK_KV_FMT_LAST; f++) {
      int64_t w = (int64_t)bk_kv_row_bytes((bk_kv_fmt)f, kvd) / 4;
      float *K = bk_alloc((size_t)(n * w)), *V = bk_alloc((size_t)(n * w));
      if (!K || !V) return 1;
      for (int64_t r = 0; r < n; r++) {
        for (int64_t i = 0; i < kvd; i++) row[i] = urand(&seed);
        op_kv_quantize_row((bk_kv_fmt)f, K + r * w, row, kvd);
        for (int64_t i = 0; i < kvd; i++) row[i] = urand(&seed);
        op_kv_quantize_row((bk_kv_fmt)f, V + r * w, row, kvd);
      }
      const float *kb[1] = {K}, *vb[1] = {V};
      kv_view view = {kb, vb, n, w, 0, n, (bk_kv_fmt)f, (bk_kv_fmt)f, w, NULL};
      double best = 1e30;
      for (int r = 0; r < reps; r++) {
        double t = now_s();
        op_attention(NULL, o, q, 1, &qr, &view, &p);
        t = now_s() - t;
        if (t < best) best = t;
      }
      printf(" %12.3f", best * 1e3);
      bk_free(K), bk_free(V);
    }
    printf("\n");
  }
  bk_free(q), bk_free(o), bk_free(row);
  return 0;
}
