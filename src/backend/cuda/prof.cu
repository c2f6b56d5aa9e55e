/* prof.cu — the CUDA backend's op profile (HEARTH_CUDA_PROFILE=PATH, or 1
 * for stderr): every op is bracketed by two CUDA events on the stream, and
 * its device time is added to a row keyed by the op, the weight's format
 * and shape (matmul) and the step's row count rounded up to a power of
 * two; the idle time between one op's end and the next one's start (the
 * host's share: launches, synchronisations, the scheduler's work between
 * steps) is added to gap rows by size. Events are read back when the
 * stream is idle anyway (sync, get) or when the table of pending pairs is
 * full. Steps are not recorded as CUDA graphs while profiling (events
 * between ops would break the recording). The table is written at close,
 * largest total first. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"

#define PROF_KEYS 512
#define PROF_PENDING 8192

struct prof_key {
  char name[96];
  double ms;
  int64_t n, rows;
  bool part;  /* a part of an op (cu_prof_part): not counted again in the busy total */
};

struct prof_pend {
  int key;
  cudaEvent_t e0, e1;
};

struct cu_prof {
  char path[512];
  prof_key keys[PROF_KEYS];
  int n_keys;
  prof_pend pend[PROF_PENDING];
  int n_pend;
  cudaEvent_t last_end; /* the end of the last op read back (NULL before the first) */
  bool have_last;
  double gap_ms[4];     /* idle between ops: < 20 us, < 200 us, < 2 ms, longer */
  int64_t gap_n[4];
  double busy_ms;
  const bk_backend_ops *inner;
};

static cu_prof *prof_of(bk_backend *be) { return cu_be(be)->prof; }

static int prof_key_id(cu_prof *p, const char *name) {
  for (int i = 0; i < p->n_keys; i++)
    if (!strcmp(p->keys[i].name, name)) return i;
  if (p->n_keys == PROF_KEYS) return PROF_KEYS - 1; /* the last row takes the overflow */
  prof_key *k = &p->keys[p->n_keys];
  snprintf(k->name, sizeof k->name, "%s", p->n_keys == PROF_KEYS - 1 ? "(other)" : name);
  return p->n_keys++;
}

/* Reads back every pending pair (their events have completed). */
static void prof_drain(cu_prof *p) {
  for (int i = 0; i < p->n_pend; i++) {
    prof_pend *e = &p->pend[i];
    float ms = 0, gap = 0;
    if (cudaEventElapsedTime(&ms, e->e0, e->e1) == cudaSuccess) {
      p->keys[e->key].ms += ms;
      if (!p->keys[e->key].part) p->busy_ms += ms;
    }
    if (p->keys[e->key].part) { /* inside an op: no gap, and the op's own pair ends later */
      cudaEventDestroy(e->e0);
      cudaEventDestroy(e->e1);
      continue;
    }
    if (p->have_last && cudaEventElapsedTime(&gap, p->last_end, e->e0) == cudaSuccess && gap > 0) {
      int g = gap < 0.02f ? 0 : gap < 0.2f ? 1 : gap < 2.0f ? 2 : 3;
      p->gap_ms[g] += gap;
      p->gap_n[g]++;
    }
    cudaGetLastError();
    cudaEventDestroy(e->e0);
    if (p->have_last) cudaEventDestroy(p->last_end);
    p->last_end = e->e1;
    p->have_last = true;
  }
  p->n_pend = 0;
}

static int prof_begin_key(cu_backend *b, const char *name, int64_t rows, bool part) {
  cu_prof *p = b->prof;
  char key[96];
  int64_t r = 1;
  while (r < rows) r *= 2;
  snprintf(key, sizeof key, "%s%s | T<=%lld", part ? "  part: " : "", name, (long long)r);
  if (p->n_pend == PROF_PENDING) {
    cudaStreamSynchronize(b->stream);
    prof_drain(p);
  }
  prof_pend *e = &p->pend[p->n_pend];
  e->key = prof_key_id(p, key);
  p->keys[e->key].part = part;
  p->keys[e->key].n++;
  p->keys[e->key].rows += rows;
  cudaEventCreate(&e->e0);
  cudaEventCreate(&e->e1);
  cudaEventRecord(e->e0, b->stream);
  return p->n_pend++;
}

static int prof_begin(bk_backend *be, const char *name, int64_t rows) { return prof_begin_key(cu_be(be), name, rows, false); }

static void prof_end(bk_backend *be, int i) {
  cu_backend *b = cu_be(be);
  cudaEventRecord(b->prof->pend[i].e1, b->stream);
}

int cu_prof_part(cu_backend *b, const char *name, int64_t rows) {
  return b->prof && b->prof->n_pend < PROF_PENDING ? prof_begin_key(b, name, rows, true) : -1;
}

void cu_prof_part_end(cu_backend *b, int i) {
  if (b->prof && i >= 0) cudaEventRecord(b->prof->pend[i].e1, b->stream);
}

static int cmp_ms(const void *a, const void *b) {
  double x = ((const prof_key *)a)->ms, y = ((const prof_key *)b)->ms;
  return x < y ? 1 : x > y ? -1 : 0;
}

void cu_prof_write(cu_backend *b) {
  cu_prof *p = b->prof;
  if (!p) return;
  cudaStreamSynchronize(b->stream);
  prof_drain(p);
  FILE *f = strcmp(p->path, "1") ? fopen(p->path, "w") : stderr;
  if (!f) f = stderr;
  qsort(p->keys, (size_t)p->n_keys, sizeof p->keys[0], cmp_ms);
  double gaps = p->gap_ms[0] + p->gap_ms[1] + p->gap_ms[2] + p->gap_ms[3];
  fprintf(f, "# cuda op profile: %.1f ms busy in ops, %.1f ms idle between them\n", p->busy_ms, gaps);
  static const char *gname[4] = {"idle < 20 us", "idle 20-200 us", "idle 0.2-2 ms", "idle > 2 ms"};
  for (int g = 0; g < 4; g++) fprintf(f, "%-60s %10.2f ms %9lld gaps\n", gname[g], p->gap_ms[g], (long long)p->gap_n[g]);
  fprintf(f, "%-60s %10s %9s %10s %10s %6s\n", "op | rows (power of two above)", "total ms", "calls", "us/call", "rows/call", "share");
  for (int i = 0; i < p->n_keys; i++) {
    const prof_key *k = &p->keys[i];
    fprintf(f, "%-60s %10.2f %9lld %10.1f %10.1f %5.1f%%\n", k->name, k->ms, (long long)k->n,
            k->n ? 1000.0 * k->ms / (double)k->n : 0.0, k->n ? (double)k->rows / (double)k->n : 0.0,
            p->busy_ms > 0 ? 100.0 * k->ms / p->busy_ms : 0.0);
  }
  if (f != stderr) fclose(f);
  if (p->have_last) cudaEventDestroy(p->last_end);
  free(p);
  b->prof = NULL;
}

/* ---- the wrapped table ---- */

#define INNER(be) (prof_of(be)->inner)
#define TIMED(be, name, rows, call)          \
  do {                                       \
    int i_ = prof_begin(be, name, rows);     \
    call;                                    \
    prof_end(be, i_);                        \
  } while (0)

static int p_set(bk_backend *be, void *dst, const void *src, size_t n, herr *err) {
  int rc;
  TIMED(be, "set (host to device)", 1, rc = INNER(be)->set(be, dst, src, n, err));
  return rc;
}
static int p_get(bk_backend *be, void *dst, const void *src, size_t n, herr *err) {
  int rc;
  TIMED(be, "get (device to host)", 1, rc = INNER(be)->get(be, dst, src, n, err));
  prof_drain(prof_of(be)); /* get waited for the stream */
  return rc;
}
static void p_copy(bk_backend *be, void *dst, const void *src, size_t n) {
  TIMED(be, "copy", 1, INNER(be)->copy(be, dst, src, n));
}
static int p_sync(bk_backend *be, herr *err) {
  int rc = INNER(be)->sync(be, err);
  prof_drain(prof_of(be));
  return rc;
}
static void p_embed(bk_backend *be, const bk_tensor *y, const bk_weight *t, const bk_tensor *ids, float s) {
  TIMED(be, "embed", y->rows, INNER(be)->embed(be, y, t, ids, s));
}
static void p_matmul(bk_backend *be, const bk_tensor *y, const bk_tensor *x, const bk_weight *w, const bk_tensor *bias) {
  char name[80];
  snprintf(name, sizeof name, "matmul %s %lldx%lld", cu_type_name(w->type), (long long)w->rows, (long long)w->cols);
  TIMED(be, name, x->rows, INNER(be)->matmul(be, y, x, w, bias));
}
static void p_rmsnorm(bk_backend *be, const bk_tensor *y, const bk_tensor *x, const bk_tensor *w, float eps, bool u) {
  TIMED(be, "rmsnorm", x->rows, INNER(be)->rmsnorm(be, y, x, w, eps, u));
}
static void p_rope(bk_backend *be, const bk_tensor *x, int64_t nh, int64_t hd, const bk_tensor *pos, const rope_table *t) {
  TIMED(be, "rope", x->rows, INNER(be)->rope(be, x, nh, hd, pos, t));
}
static void p_act_mul(bk_backend *be, const bk_tensor *g, const bk_tensor *u, bk_act a) {
  TIMED(be, "act_mul", g->rows, INNER(be)->act_mul(be, g, u, a));
}
static void p_add(bk_backend *be, const bk_tensor *y, const bk_tensor *a, const bk_tensor *c) {
  TIMED(be, "add", y->rows, INNER(be)->add(be, y, a, c));
}
static void p_add_rmsnorm(bk_backend *be, const bk_tensor *x, const bk_tensor *d, const bk_tensor *y, const bk_tensor *w,
                          float eps, bool u) {
  TIMED(be, "add_rmsnorm", x->rows, INNER(be)->add_rmsnorm(be, x, d, y, w, eps, u));
}
static void p_get_rows(bk_backend *be, const bk_tensor *y, const bk_tensor *x, const bk_tensor *r) {
  TIMED(be, "get_rows", y->rows, INNER(be)->get_rows(be, y, x, r));
}
static void p_kv_write(bk_backend *be, const bk_kv_layer *kv, const bk_tensor *k, const bk_tensor *v, const bk_tensor *s) {
  TIMED(be, "kv_write", k->rows, INNER(be)->kv_write(be, kv, k, v, s));
}
static void p_attention(bk_backend *be, const bk_tensor *out, const bk_tensor *q, const bk_kv_layer *kv,
                        const bk_attn_index *ix, const attn_params *ap) {
  TIMED(be, "attention", q->rows, INNER(be)->attention(be, out, q, kv, ix, ap));
}
static int p_sample(bk_backend *be, const bk_tensor *logits, const bk_sample_row *rows, const bk_sample_adj *adj,
                    int64_t n_adj, bk_sample_out *out, herr *err) {
  int rc;
  TIMED(be, "sample (params in, ids out)", logits->rows, rc = INNER(be)->sample(be, logits, rows, adj, n_adj, out, err));
  prof_drain(prof_of(be)); /* sample waited for its results */
  return rc;
}
static void p_moe(bk_backend *be, const bk_tensor *y, const bk_tensor *x, const bk_tensor *ids, const bk_tensor *w,
                  const bk_experts *ex, bk_act a) {
  TIMED(be, "moe", x->rows, INNER(be)->moe(be, y, x, ids, w, ex, a));
}
static void p_lora(bk_backend *be, const bk_tensor *y, const bk_tensor *x, const bk_tensor *a, const bk_tensor *bb, float s) {
  TIMED(be, "lora", x->rows, INNER(be)->lora(be, y, x, a, bb, s));
}
static void p_close(bk_backend *be) {
  cu_backend *b = cu_be(be);
  const bk_backend_ops *inner = b->prof->inner;
  cu_prof_write(b);
  inner->close(be);
}

/* Turns the profile on for b when HEARTH_CUDA_PROFILE names a file (or is 1). */
void cu_prof_open(cu_backend *b) {
  const char *path = getenv("HEARTH_CUDA_PROFILE");
  if (!path || !path[0] || !strcmp(path, "0")) return;
  cu_prof *p = (cu_prof *)calloc(1, sizeof *p);
  static bk_backend_ops ops; /* one profiled backend per process is what this serves */
  if (!p) return;
  snprintf(p->path, sizeof p->path, "%s", path);
  p->inner = b->base.ops;
  ops = *b->base.ops;
  ops.close = p_close, ops.set = p_set, ops.get = p_get, ops.copy = p_copy, ops.sync = p_sync;
  ops.embed = p_embed, ops.matmul = p_matmul, ops.rmsnorm = p_rmsnorm, ops.rope = p_rope, ops.act_mul = p_act_mul;
  ops.add = p_add, ops.add_rmsnorm = p_add_rmsnorm, ops.get_rows = p_get_rows, ops.kv_write = p_kv_write, ops.attention = p_attention;
  ops.sample = p_sample, ops.moe = p_moe, ops.lora = p_lora;
  b->prof = p;
  b->no_graphs = true;
  b->base.ops = &ops;
}
