/* host_path.h — the ops a backend may lack run on the host instead (see
 * backend.h, "what a backend runs"): internal to backend/, called by the
 * dispatch in backend.c with the op's own arguments. Each reads its inputs
 * back through the backend's get, runs the plain reference (ops.h, cpu/ref.c,
 * cpu/sample_cpu.c) on host memory and writes the result with set; a failure
 * is recorded on the backend (bk_backend.refused). */
#ifndef HEARTH_BACKEND_HOST_PATH_H
#define HEARTH_BACKEND_HOST_PATH_H

#include "backend/backend.h"

void host_rmsnorm(bk_backend *be, const bk_tensor *y, const bk_tensor *x, const bk_tensor *w, float eps, bool unit_offset);
void host_rope(bk_backend *be, const bk_tensor *x, int64_t n_heads, int64_t head_dim, const bk_tensor *pos, const rope_table *t);
void host_act_mul(bk_backend *be, const bk_tensor *gate, const bk_tensor *up, bk_act act);
void host_add(bk_backend *be, const bk_tensor *y, const bk_tensor *a, const bk_tensor *b);
void host_softcap(bk_backend *be, const bk_tensor *x, float cap);
void host_get_rows(bk_backend *be, const bk_tensor *y, const bk_tensor *x, const bk_tensor *rows);
void host_scale(bk_backend *be, const bk_tensor *x, float s);
void host_get_cols(bk_backend *be, const bk_tensor *y, const bk_tensor *x, int64_t c0);
void host_moe_route(bk_backend *be, const bk_tensor *ids, const bk_tensor *w, const bk_tensor *logits, bool norm,
                    const bk_tensor *scale);
void host_sigmoid_mul(bk_backend *be, const bk_tensor *y, const bk_tensor *g);
void host_set_cols(bk_backend *be, const bk_tensor *y, const bk_tensor *x, int64_t c0);
void host_set_rows(bk_backend *be, const bk_tensor *y, const bk_tensor *x, const bk_tensor *rows);
void host_layernorm(bk_backend *be, const bk_tensor *y, const bk_tensor *x, const bk_tensor *w, const bk_tensor *b, float eps);
void host_moe_route_group(bk_backend *be, const bk_tensor *ids, const bk_tensor *w, const bk_tensor *logits,
                          const bk_tensor *bias, int64_t n_group, int64_t topk_group, bool norm, float scale);
void host_lora(bk_backend *be, const bk_tensor *y, const bk_tensor *x, const bk_tensor *a, const bk_tensor *b, float scale);
void host_act(bk_backend *be, const bk_tensor *x, bk_act act);
void host_clamp(bk_backend *be, const bk_tensor *x, float lo, float hi);
void host_embed_bag(bk_backend *be, const bk_tensor *y, const bk_tensor *table, const bk_tensor *ids, const bk_tensor *w);
int host_sample(bk_backend *be, const bk_tensor *logits, const bk_sample_row *rows, const bk_sample_adj *adj, int64_t n_adj,
                bk_sample_out *out, herr *err);

/* Records e on be unless an earlier error is waiting there. */
void bk_backend_record(bk_backend *be, const herr *e);

#endif
