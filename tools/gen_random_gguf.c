/* gen_random_gguf.c — writes a GGUF with random weights, for benchmarks that
 * run the same file through hearth and llama.cpp:
 *   1b, tiny   llama architecture in the shape of Llama-3.2-1B (or a small one);
 *   8b         llama architecture in the shape of Llama-3.1-8B (untied output);
 *   a3b, moe-tiny
 *              llama.cpp's qwen3moe architecture in Qwen3-30B-A3B's geometry
 *              (hidden 2048, 32 q heads / 4 kv heads of 128, q/k norms,
 *              experts of FFN 768, 8 used per token, untied output) with fewer
 *              layers and a smaller vocabulary so that it fits a small machine:
 *              4 layers of 128 experts and a 32000-token vocabulary unless
 *              LAYERS, EXPERTS or VOCAB say otherwise (moe-tiny: a quick check).
 * The experts are stacked 3-D as llama.cpp writes them (ffn_gate_exps,
 * ffn_up_exps [experts, 768, 2048], ffn_down_exps [experts, 2048, 768]); the
 * router (ffn_gate_inp) and norms stay f32 as llama.cpp's quantizer leaves
 * them. Weight types: f16, q8_0, q4_0, q5_0, q5_1, iq4_nl (quantized from
 * random normals), q4_k, q2_k, q3_k, iq4_xs (every other matrix; these blocks
 * are random bytes under small fixed scales, not a quantized normal
 * distribution: a speed run's weights, written at the disk's rate). The vocabulary is
 * a SentencePiece-style one with byte tokens and filler pieces, enough for
 * both runtimes to load the file.
 *   llama2-tiny
 *              a llama of hidden size 8, one block, two heads of 4, FFN 32, an
 *              untied output and a 32000-token vocabulary: with
 *              --vocab ggml-vocab-llama-spm.gguf (llama.cpp's models/, fetched by
 *              tools/fetch_test_deps.sh) it carries Llama 2's SentencePiece
 *              vocabulary, and is the tests' llama-2-tiny-random.gguf.
 * --vocab FILE copies every tokenizer.ggml.* key of the GGUF FILE (a vocabulary
 * file) in place of the generated vocabulary; the vocabulary size is then FILE's.
 * The random weights come from a fixed seed: the same arguments write the same
 * bytes.
 * A shape name ending in "-wild" (1b-wild, tiny-wild, ...) makes activations
 * that are not tame: the q and k projections are scaled up 6x each, so the
 * attention scores spread with a standard deviation near 36 instead of 1 and
 * softmax meets values deep in the float range's denormal tail (exp of -87 to
 * -103), as trained models' sharp attention heads do; the residual stream
 * then carries the large values that follow.
 *
 *   cc -O2 -o gen_random_gguf tools/gen_random_gguf.c -lm
 *   ./gen_random_gguf [--vocab FILE] OUT.gguf f16|q8_0|q4_0|q4_k|q5_0|q5_1|q2_k|q3_k|iq4_nl|iq4_xs
 *                     [1b|8b|tiny|llama2-tiny|a3b|moe-tiny[-wild] [LAYERS [EXPERTS [VOCAB]]]]
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { T_F32 = 0, T_F16 = 1, T_Q4_0 = 2, T_Q5_0 = 6, T_Q5_1 = 7, T_Q8_0 = 8, T_Q2_K = 10, T_Q3_K = 11, T_Q4_K = 12,
       T_IQ4_NL = 20, T_IQ4_XS = 23 };
static const int8_t iq4nl_levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
enum { V_U32 = 4, V_I32 = 5, V_F32 = 6, V_BOOL = 7, V_STRING = 8, V_ARRAY = 9 };

typedef struct {
  const char *arch, *name;
  int hidden, layers, heads, kv_heads, head_dim, ffn, vocab, ctx;
  int experts, experts_used, expert_ffn; /* 0 experts: a dense llama */
  float rope_theta, eps;
  int untied;                            /* a dense llama with its own output matrix */
} shape;

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(void) { /* approx N(0,1): sum of 4 uniforms, rescaled */
  float s = 0;
  for (int i = 0; i < 4; i++) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    s += (float)(rng >> 40) / (float)(1ull << 24);
  }
  return (s - 2.0f) * 1.7320508f;
}

static uint16_t f32_to_f16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  int e = (int)((x >> 23) & 0xff) - 127 + 15;
  uint32_t m = x & 0x7fffff;
  if (e <= 0) return (uint16_t)sign;
  if (e >= 31) return (uint16_t)(sign | 0x7c00);
  uint32_t h = sign | ((uint32_t)e << 10) | (m >> 13);
  if (m & 0x1000) h++; /* round half up */
  return (uint16_t)h;
}

static void w_u32(FILE *f, uint32_t v) { fwrite(&v, 4, 1, f); }
static void w_u64(FILE *f, uint64_t v) { fwrite(&v, 8, 1, f); }
static void w_str(FILE *f, const char *s) { w_u64(f, strlen(s)); fwrite(s, 1, strlen(s), f); }
static void kv_str(FILE *f, const char *k, const char *v) { w_str(f, k); w_u32(f, V_STRING); w_str(f, v); }
static void kv_u32(FILE *f, const char *k, uint32_t v) { w_str(f, k); w_u32(f, V_U32); w_u32(f, v); }
static void kv_f32(FILE *f, const char *k, float v) { w_str(f, k); w_u32(f, V_F32); fwrite(&v, 4, 1, f); }
static void kv_bool(FILE *f, const char *k, int v) { w_str(f, k); w_u32(f, V_BOOL); uint8_t b = (uint8_t)v; fwrite(&b, 1, 1, f); }

/* ne0 is the row length (GGUF's fastest dimension); ne2 > 1 stacks ne2 matrices of ne1 rows */
typedef struct { char name[64]; int type; int64_t ne0, ne1, ne2; uint64_t off, size; float std; int ones; } tinfo;

static uint64_t tsize(int type, int64_t ne0, int64_t ne1, int64_t ne2) {
  int64_t n = ne0 * ne1 * ne2;
  switch (type) {
    case T_F32: return (uint64_t)n * 4;
    case T_F16: return (uint64_t)n * 2;
    case T_Q8_0: return (uint64_t)(n / 32) * 34;
    case T_Q4_K: return (uint64_t)(n / 256) * 144;
    case T_Q5_0: return (uint64_t)(n / 32) * 22;
    case T_Q5_1: return (uint64_t)(n / 32) * 24;
    case T_Q2_K: return (uint64_t)(n / 256) * 84;
    case T_Q3_K: return (uint64_t)(n / 256) * 110;
    case T_IQ4_XS: return (uint64_t)(n / 256) * 136;
    default: return (uint64_t)(n / 32) * 18; /* q4_0, iq4_nl */
  }
}

static void write_tensor(FILE *f, const tinfo *t) {
  int64_t n = t->ne0 * t->ne1 * t->ne2;
  if (t->type == T_F32) {
    for (int64_t i = 0; i < n; i++) { float v = t->ones ? 1.0f : frand() * t->std; fwrite(&v, 4, 1, f); }
    return;
  }
  if (t->type == T_F16) {
    uint16_t buf[4096];
    for (int64_t i = 0; i < n; i += 4096) {
      int m = (int)(n - i < 4096 ? n - i : 4096);
      for (int j = 0; j < m; j++) buf[j] = f32_to_f16(frand() * t->std);
      fwrite(buf, 2, (size_t)m, f);
    }
    return;
  }
  if (t->type == T_Q4_K) { /* d, dmin (f16), 12 bytes of 6-bit scales / mins, 128 bytes of nibbles */
    static uint8_t buf[144 * 1024];
    uint16_t d = f32_to_f16(t->std * 4.0f / (63.0f * 15.0f)), dmin = f32_to_f16(t->std * 2.0f / 63.0f);
    for (int64_t b = 0; b < n / 256; b += 1024) {
      int m = (int)(n / 256 - b < 1024 ? n / 256 - b : 1024);
      for (int j = 0; j < m; j++) {
        uint8_t *q = buf + 144 * j;
        memcpy(q, &d, 2);
        memcpy(q + 2, &dmin, 2);
        for (int w = 4; w < 144; w += 4) {
          rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
          uint32_t v = (uint32_t)(rng >> 32);
          memcpy(q + w, &v, 4);
        }
      }
      fwrite(buf, 144, (size_t)m, f);
    }
    return;
  }
  if (t->type == T_Q2_K || t->type == T_Q3_K || t->type == T_IQ4_XS) {
    /* random bytes under small fixed super-block scales (as q4_k): d, and dmin for q2_K */
    const int bs = t->type == T_Q2_K ? 84 : t->type == T_Q3_K ? 110 : 136;
    const int doff = t->type == T_Q2_K ? 80 : t->type == T_Q3_K ? 108 : 0;
    const float dv = t->type == T_Q2_K ? t->std * 2.0f / 45.0f : t->type == T_Q3_K ? t->std / 64.0f : t->std / (16.0f * 127.0f);
    uint16_t d = f32_to_f16(dv), dmin = f32_to_f16(t->std / 15.0f);
    static uint8_t buf[136 * 1024];
    for (int64_t b = 0; b < n / 256; b += 1024) {
      int m = (int)(n / 256 - b < 1024 ? n / 256 - b : 1024);
      for (int k = 0; k < bs * m; k += 4) {
        rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
        uint32_t v = (uint32_t)(rng >> 32);
        memcpy(buf + k, &v, 4);
      }
      for (int j = 0; j < m; j++) {
        memcpy(buf + bs * j + doff, &d, 2);
        if (t->type == T_Q2_K) memcpy(buf + bs * j + 82, &dmin, 2);
      }
      fwrite(buf, (size_t)bs, (size_t)m, f);
    }
    return;
  }
  for (int64_t b = 0; b < n / 32; b++) {
    float x[32], amax = 0, mx = 0;
    for (int j = 0; j < 32; j++) {
      x[j] = frand() * t->std;
      if (fabsf(x[j]) > amax) { amax = fabsf(x[j]); mx = x[j]; }
    }
    if (t->type == T_Q8_0) {
      float d = amax / 127.0f, id = d ? 1.0f / d : 0;
      uint16_t dh = f32_to_f16(d);
      int8_t q[32];
      for (int j = 0; j < 32; j++) q[j] = (int8_t)roundf(x[j] * id);
      fwrite(&dh, 2, 1, f);
      fwrite(q, 1, 32, f);
    } else if (t->type == T_Q5_0 || t->type == T_Q5_1) { /* 5-bit quants: fifth bits in a 32-bit word, nibbles as q4_0 */
      float lo = x[0], hi = x[0];
      for (int j = 1; j < 32; j++) { lo = fminf(lo, x[j]); hi = fmaxf(hi, x[j]); }
      float d = t->type == T_Q5_0 ? mx / -16.0f : (hi - lo) / 31.0f, id = d ? 1.0f / d : 0;
      uint16_t dh = f32_to_f16(d), mh = f32_to_f16(lo);
      uint8_t q[16];
      uint32_t qh = 0;
      for (int j = 0; j < 32; j++) {
        int v = t->type == T_Q5_0 ? (int)(x[j] * id + 16.5f) : (int)((x[j] - lo) * id + 0.5f);
        v = v < 0 ? 0 : v > 31 ? 31 : v;
        if (j < 16) q[j] = (uint8_t)(v & 15);
        else q[j - 16] |= (uint8_t)((v & 15) << 4);
        qh |= (uint32_t)(v >> 4) << j;
      }
      fwrite(&dh, 2, 1, f);
      if (t->type == T_Q5_1) fwrite(&mh, 2, 1, f);
      fwrite(&qh, 4, 1, f);
      fwrite(q, 1, 16, f);
    } else if (t->type == T_IQ4_NL) { /* the nearest of the 16 levels at d = max / -127 */
      float d = mx / -127.0f, id = d ? 1.0f / d : 0;
      uint16_t dh = f32_to_f16(d);
      uint8_t q[16] = {0};
      for (int j = 0; j < 32; j++) {
        int best = 0;
        for (int k = 1; k < 16; k++)
          if (fabsf(x[j] * id - iq4nl_levels[k]) < fabsf(x[j] * id - iq4nl_levels[best])) best = k;
        q[j % 16] |= (uint8_t)(best << (j < 16 ? 0 : 4));
      }
      fwrite(&dh, 2, 1, f);
      fwrite(q, 1, 16, f);
    } else {
      float d = mx / -8.0f, id = d ? 1.0f / d : 0;
      uint16_t dh = f32_to_f16(d);
      uint8_t q[16];
      for (int j = 0; j < 16; j++) {
        int a = (int)(x[j] * id + 8.5f), c = (int)(x[j + 16] * id + 8.5f);
        a = a < 0 ? 0 : a > 15 ? 15 : a;
        c = c < 0 ? 0 : c > 15 ? 15 : c;
        q[j] = (uint8_t)(a | (c << 4));
      }
      fwrite(&dh, 2, 1, f);
      fwrite(q, 1, 16, f);
    }
  }
}

/* The tokenizer.ggml.* key/value pairs of a GGUF file, as raw bytes. */
typedef struct { unsigned char *buf; size_t n, cap; int count; uint64_t vocab; } kvcopy;

static int skip_value(const unsigned char *d, size_t n, size_t *at, uint32_t type, int depth) {
  static const int size[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
  if (type == V_STRING) {
    uint64_t l;
    if (*at + 8 > n) return -1;
    memcpy(&l, d + *at, 8);
    if (l > n - *at - 8) return -1;
    *at += 8 + l;
    return 0;
  }
  if (type == V_ARRAY) {
    uint32_t et;
    uint64_t cnt;
    if (depth > 0 || *at + 12 > n) return -1;
    memcpy(&et, d + *at, 4);
    memcpy(&cnt, d + *at + 4, 8);
    *at += 12;
    for (uint64_t i = 0; i < cnt; i++)
      if (skip_value(d, n, at, et, depth + 1)) return -1;
    return 0;
  }
  if (type > 12 || !size[type] || *at + (size_t)size[type] > n) return -1;
  *at += (size_t)size[type];
  return 0;
}

static int read_vocab(const char *path, kvcopy *out) {
  FILE *f = fopen(path, "rb");
  if (!f) { perror(path); return -1; }
  fseek(f, 0, SEEK_END);
  long sz = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *d = malloc((size_t)sz);
  if (!d || fread(d, 1, (size_t)sz, f) != (size_t)sz) { fclose(f); free(d); fprintf(stderr, "%s: cannot read\n", path); return -1; }
  fclose(f);
  uint64_t nkv;
  size_t n = (size_t)sz, at = 24;
  if (n < 24 || memcmp(d, "GGUF", 4)) { free(d); fprintf(stderr, "%s: not a GGUF file\n", path); return -1; }
  memcpy(&nkv, d + 16, 8);
  out->cap = n;
  out->buf = malloc(n);
  for (uint64_t i = 0; i < nkv; i++) {
    size_t start = at;
    uint64_t kl;
    uint32_t type;
    if (at + 12 > n) goto bad;
    memcpy(&kl, d + at, 8);
    if (kl > n - at - 12) goto bad;
    const char *key = (const char *)d + at + 8;
    at += 8 + kl;
    memcpy(&type, d + at, 4);
    at += 4;
    if (kl == strlen("tokenizer.ggml.tokens") && !memcmp(key, "tokenizer.ggml.tokens", kl) && type == V_ARRAY && at + 12 <= n)
      memcpy(&out->vocab, d + at + 4, 8);
    if (skip_value(d, n, &at, type, 0)) goto bad;
    if (kl > 15 && !memcmp(key, "tokenizer.ggml.", 15)) {
      memcpy(out->buf + out->n, d + start, at - start);
      out->n += at - start;
      out->count++;
    }
  }
  free(d);
  if (!out->vocab) { fprintf(stderr, "%s: no tokenizer.ggml.tokens\n", path); return -1; }
  return 0;
bad:
  free(d);
  fprintf(stderr, "%s: malformed metadata\n", path);
  return -1;
}

int main(int argc, char **argv) {
  const char *vocab_path = NULL;
  for (int i = 1; i + 1 < argc; i++)
    if (!strcmp(argv[i], "--vocab")) {
      vocab_path = argv[i + 1];
      memmove(argv + i, argv + i + 2, sizeof *argv * (size_t)(argc - i - 1));
      argc -= 2;
      break;
    }
  if (argc < 3) {
    fprintf(stderr, "usage: %s [--vocab FILE] OUT.gguf f16|q8_0|q4_0|q4_k|q5_0|q5_1|q2_k|q3_k|iq4_nl|iq4_xs [1b|8b|tiny|llama2-tiny|a3b|moe-tiny[-wild] [LAYERS [EXPERTS [VOCAB]]]]\n", argv[0]);
    return 2;
  }
  kvcopy vk = {0};
  if (vocab_path && read_vocab(vocab_path, &vk)) return 1;
  static const struct { const char *name; int type; } wtypes[] = {
      {"f16", T_F16},   {"q8_0", T_Q8_0}, {"q4_0", T_Q4_0}, {"q4_k", T_Q4_K},     {"q5_0", T_Q5_0},
      {"q5_1", T_Q5_1}, {"q2_k", T_Q2_K}, {"q3_k", T_Q3_K}, {"iq4_nl", T_IQ4_NL}, {"iq4_xs", T_IQ4_XS}};
  int wt = -1;
  for (size_t i = 0; i < sizeof wtypes / sizeof wtypes[0]; i++)
    if (!strcmp(argv[2], wtypes[i].name)) wt = wtypes[i].type;
  if (wt < 0) { fprintf(stderr, "unknown type %s\n", argv[2]); return 2; }
  char sn[32];
  snprintf(sn, sizeof sn, "%s", argc > 3 ? argv[3] : "1b");
  size_t snl = strlen(sn);
  float wild = 1.0f; /* the q / k scale: 6 for a "-wild" shape */
  if (snl > 5 && !strcmp(sn + snl - 5, "-wild")) { sn[snl - 5] = 0; wild = 6.0f; }
  shape s;
  if (!strcmp(sn, "1b")) s = (shape){"llama", "random-llama-1b", 2048, 16, 32, 8, 64, 8192, 128256, 131072, 0, 0, 0, 500000.0f, 1e-5f, 0};
  else if (!strcmp(sn, "8b"))
    s = (shape){"llama", "random-llama-8b", 4096, 32, 32, 8, 128, 14336, 128256, 131072, 0, 0, 0, 500000.0f, 1e-5f, 1};
  else if (!strcmp(sn, "tiny")) s = (shape){"llama", "random-llama-1b", 256, 2, 4, 2, 64, 512, 1024, 2048, 0, 0, 0, 500000.0f, 1e-5f, 0};
  else if (!strcmp(sn, "llama2-tiny"))
    s = (shape){"llama", "llama-2-tiny-random", 8, 1, 2, 2, 4, 32, 32000, 4096, 0, 0, 0, 10000.0f, 1e-5f, 1};
  else if (!strcmp(sn, "a3b"))
    s = (shape){"qwen3moe", "random-qwen3moe-a3b", 2048, 4, 32, 4, 128, 6144, 32000, 40960, 128, 8, 768, 1000000.0f, 1e-6f, 0};
  else if (!strcmp(sn, "moe-tiny"))
    s = (shape){"qwen3moe", "random-qwen3moe-tiny", 256, 2, 4, 2, 64, 512, 1024, 2048, 16, 4, 128, 1000000.0f, 1e-6f, 0};
  else { fprintf(stderr, "unknown shape %s\n", sn); return 2; }
  if (argc > 4) s.layers = atoi(argv[4]);
  if (argc > 5) s.experts = atoi(argv[5]);
  if (argc > 6) s.vocab = atoi(argv[6]);
  if (vk.vocab) s.vocab = (int)vk.vocab;
  bool moe = s.experts > 0;
  if (s.layers < 1 || s.vocab < 300 || (moe && s.experts < s.experts_used)) { fprintf(stderr, "bad LAYERS, EXPERTS or VOCAB\n"); return 2; }
  int hd = s.head_dim, qd = hd * s.heads, kvd = hd * s.kv_heads;

  tinfo *ts = calloc((size_t)(3 + 12 * s.layers), sizeof *ts);
  int nt = 0;
#define ADD3(nm, ty, a, b, c, sd, one) do { tinfo *t = &ts[nt++]; snprintf(t->name, sizeof t->name, "%s", nm); t->type = ty; t->ne0 = a; t->ne1 = b; t->ne2 = c; t->std = sd; t->ones = one; } while (0)
#define ADD(nm, ty, a, b, sd, one) ADD3(nm, ty, a, b, 1, sd, one)
  ADD("token_embd.weight", wt, s.hidden, s.vocab, 1.0f, 0);
  ADD("output_norm.weight", T_F32, s.hidden, 1, 0, 1);
  float sh = 1.0f / sqrtf((float)s.hidden), sq = 1.0f / sqrtf((float)qd);
  if (moe || s.untied) ADD("output.weight", wt, s.hidden, s.vocab, sh, 0); /* Qwen3-MoE's output is its own matrix */
  char nm[64];
  for (int l = 0; l < s.layers; l++) {
#define L(suffix) (snprintf(nm, sizeof nm, "blk.%d.%s", l, suffix), nm)
    ADD(L("attn_norm.weight"), T_F32, s.hidden, 1, 0, 1);
    ADD(L("attn_q.weight"), wt, s.hidden, qd, sh * wild, 0);
    ADD(L("attn_k.weight"), wt, s.hidden, kvd, sh * wild, 0);
    ADD(L("attn_v.weight"), wt, s.hidden, kvd, sh, 0);
    ADD(L("attn_output.weight"), wt, qd, s.hidden, sq, 0);
    ADD(L("ffn_norm.weight"), T_F32, s.hidden, 1, 0, 1);
    if (moe) {
      float sf = 1.0f / sqrtf((float)s.expert_ffn);
      ADD(L("attn_q_norm.weight"), T_F32, hd, 1, 0, 1);
      ADD(L("attn_k_norm.weight"), T_F32, hd, 1, 0, 1);
      ADD(L("ffn_gate_inp.weight"), T_F32, s.hidden, s.experts, sh, 0);
      ADD3(L("ffn_gate_exps.weight"), wt, s.hidden, s.expert_ffn, s.experts, sh, 0);
      ADD3(L("ffn_up_exps.weight"), wt, s.hidden, s.expert_ffn, s.experts, sh, 0);
      ADD3(L("ffn_down_exps.weight"), wt, s.expert_ffn, s.hidden, s.experts, sf, 0);
    } else {
      float sf = 1.0f / sqrtf((float)s.ffn);
      ADD(L("ffn_gate.weight"), wt, s.hidden, s.ffn, sh, 0);
      ADD(L("ffn_up.weight"), wt, s.hidden, s.ffn, sh, 0);
      ADD(L("ffn_down.weight"), wt, s.ffn, s.hidden, sf, 0);
    }
#undef L
  }
  uint64_t off = 0;
  for (int i = 0; i < nt; i++) {
    ts[i].off = off;
    ts[i].size = tsize(ts[i].type, ts[i].ne0, ts[i].ne1, ts[i].ne2);
    off += (ts[i].size + 31) / 32 * 32;
  }

  FILE *f = fopen(argv[1], "wb");
  if (!f) { perror(argv[1]); return 1; }
  fwrite("GGUF", 1, 4, f);
  w_u32(f, 3);
  w_u64(f, (uint64_t)nt);
  w_u64(f, (uint64_t)((moe ? 25 : 17) - (vk.count ? 6 - vk.count : 0))); /* metadata count */
  char k[96];
#define K(suffix) (snprintf(k, sizeof k, "%s.%s", s.arch, suffix), k)
  kv_str(f, "general.architecture", s.arch);
  kv_str(f, "general.name", s.name);
  kv_u32(f, "general.alignment", 32);
  kv_u32(f, K("context_length"), (uint32_t)s.ctx);
  kv_u32(f, K("embedding_length"), (uint32_t)s.hidden);
  kv_u32(f, K("block_count"), (uint32_t)s.layers);
  kv_u32(f, K("feed_forward_length"), (uint32_t)s.ffn);
  kv_u32(f, K("attention.head_count"), (uint32_t)s.heads);
  kv_u32(f, K("attention.head_count_kv"), (uint32_t)s.kv_heads);
  kv_f32(f, K("attention.layer_norm_rms_epsilon"), s.eps);
  kv_f32(f, K("rope.freq_base"), s.rope_theta);
  if (moe) {
    kv_u32(f, K("attention.key_length"), (uint32_t)hd);
    kv_u32(f, K("attention.value_length"), (uint32_t)hd);
    kv_u32(f, K("rope.dimension_count"), (uint32_t)hd);
    kv_u32(f, K("expert_count"), (uint32_t)s.experts);
    kv_u32(f, K("expert_used_count"), (uint32_t)s.experts_used);
    kv_u32(f, K("expert_feed_forward_length"), (uint32_t)s.expert_ffn);
    kv_u32(f, K("vocab_size"), (uint32_t)s.vocab);
    kv_bool(f, "tokenizer.ggml.add_bos_token", 0);
  }
#undef K
  if (vk.count) { /* the vocabulary file's tokenizer keys in place of the six below */
    fwrite(vk.buf, 1, vk.n, f);
    goto tensors;
  }
  kv_str(f, "tokenizer.ggml.model", "llama");
  /* tokens, scores, token types */
  w_str(f, "tokenizer.ggml.tokens"); w_u32(f, V_ARRAY); w_u32(f, V_STRING); w_u64(f, (uint64_t)s.vocab);
  for (int i = 0; i < s.vocab; i++) {
    char tok[32];
    if (i == 0) strcpy(tok, "<unk>");
    else if (i == 1) strcpy(tok, "<s>");
    else if (i == 2) strcpy(tok, "</s>");
    else if (i < 259) snprintf(tok, sizeof tok, "<0x%02X>", i - 3);
    else snprintf(tok, sizeof tok, "\xe2\x96\x81t%d", i);
    w_str(f, tok);
  }
  w_str(f, "tokenizer.ggml.scores"); w_u32(f, V_ARRAY); w_u32(f, V_F32); w_u64(f, (uint64_t)s.vocab);
  for (int i = 0; i < s.vocab; i++) { float sc = i < 259 ? 0.0f : -(float)i; fwrite(&sc, 4, 1, f); }
  w_str(f, "tokenizer.ggml.token_type"); w_u32(f, V_ARRAY); w_u32(f, V_I32); w_u64(f, (uint64_t)s.vocab);
  for (int i = 0; i < s.vocab; i++) { int32_t ty = i == 0 ? 2 : i < 3 ? 3 : i < 259 ? 6 : 1; fwrite(&ty, 4, 1, f); }
  kv_u32(f, "tokenizer.ggml.bos_token_id", 1);
  kv_u32(f, "tokenizer.ggml.eos_token_id", 2);
tensors:
  for (int i = 0; i < nt; i++) {
    w_str(f, ts[i].name);
    int nd = ts[i].ne2 > 1 ? 3 : ts[i].ne1 == 1 ? 1 : 2;
    w_u32(f, (uint32_t)nd);
    w_u64(f, (uint64_t)ts[i].ne0);
    if (nd >= 2) w_u64(f, (uint64_t)ts[i].ne1);
    if (nd == 3) w_u64(f, (uint64_t)ts[i].ne2);
    w_u32(f, (uint32_t)ts[i].type);
    w_u64(f, ts[i].off);
  }
  long pos = ftell(f);
  while (pos % 32) { fputc(0, f); pos++; }
  for (int i = 0; i < nt; i++) {
    write_tensor(f, &ts[i]);
    uint64_t pad = (ts[i].size + 31) / 32 * 32 - ts[i].size;
    for (uint64_t p = 0; p < pad; p++) fputc(0, f);
  }
  if (fclose(f)) { perror(argv[1]); return 1; }
  free(ts);
  free(vk.buf);
  return 0;
}
