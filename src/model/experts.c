/* experts.c — expert residency under a byte budget (model_load_opts.
 * expert_budget): the experts of a mixture of experts stay mapped from the
 * weight file and are loaded into the backend when a step's routing first
 * chooses them; after each layer the least recently used ones are released
 * (their packed copies freed, their file pages given back) until the
 * resident bytes fit the budget (on a device: uploaded on use, freed when
 * released). The experts a layer uses are always
 * loaded while it runs, so the logits are the same with any budget. Knows
 * nothing of routing itself; reads the routed ids the backend wrote. */
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/vec.h"
#include "model/internal.h"

typedef struct expert_slot {
  int32_t prev, next;   /* LRU links, -1 */
  bool resident;
  bool mapped;          /* its bytes are in the file mapping (not a copy the model owns) */
  int64_t bytes;
} expert_slot;

/* Whether [p, p + n) lies in the weights' file mapping (GGUF data always does). */
static bool in_mapping(const model *m, const void *p, size_t n) {
  if (m->gg) return true;
  for (int i = 0; m->st_opened && i < m->st.nshards; i++) {
    const unsigned char *b = m->st.maps[i].data;
    if (b && (const unsigned char *)p >= b && (const unsigned char *)p + n <= b + m->st.maps[i].size) return true;
  }
  return false;
}

static int64_t stored_bytes(const bk_weight *w) { return (int64_t)((size_t)w->rows * bk_row_bytes(w->type, w->cols, w->bits)); }

static bk_weight *expert_mat(model *m, int l, int e, int k) {
  layer_weights *lw = &m->layers[l];
  return &lw->experts[(int64_t)k * lw->ex.n + e];
}

static void lru_unlink(expert_cache *c, int32_t i) {
  expert_slot *s = &c->slots[i];
  if (s->prev >= 0) c->slots[s->prev].next = s->next;
  else c->head = s->next;
  if (s->next >= 0) c->slots[s->next].prev = s->prev;
  else c->tail = s->prev;
  s->prev = s->next = -1;
}

static void lru_push(expert_cache *c, int32_t i) {
  expert_slot *s = &c->slots[i];
  s->prev = c->tail;
  s->next = -1;
  if (c->tail >= 0) c->slots[c->tail].next = i;
  else c->head = i;
  c->tail = i;
}

int experts_budget_init(model *m, int64_t budget, herr *err) {
  expert_cache *c = &m->xc;
  const model_config *cfg = &m->cfg;
  int64_t L = cfg->num_hidden_layers, E = cfg->num_experts;
  c->slots = calloc((size_t)(L * E), sizeof *c->slots);
  c->host = calloc((size_t)(L * E * 3), sizeof *c->host);
  if (!c->slots || !c->host) return herr_set(err, HEARTH_ENOMEM, "out of memory for the expert table");
  c->budget = budget;
  c->n_experts = (int)E;
  c->head = c->tail = -1;
  for (int64_t l = 0; l < L; l++)
    for (int64_t e = 0; e < E; e++) {
      expert_slot *s = &c->slots[l * E + e];
      s->prev = s->next = -1;
      if (!m->layers[l].moe) continue;
      s->mapped = true;
      for (int k = 0; k < 3; k++) {
        const bk_weight *w = expert_mat(m, (int)l, (int)e, k);
        c->host[(l * E + e) * 3 + k] = *w;
        s->bytes += stored_bytes(w);
        s->mapped &= in_mapping(m, w->data, (size_t)stored_bytes(w));
      }
      c->total += s->bytes;
    }
  return 0;
}

void experts_budget_free(model *m) {
  free(m->xc.slots);
  free(m->xc.host);
  free(m->xc.ids);
  memset(&m->xc, 0, sizeof m->xc);
}

static void release(model *m, int l, int e) {
  expert_cache *c = &m->xc;
  expert_slot *s = &c->slots[(int64_t)l * c->n_experts + e];
  for (int k = 0; k < 3; k++) {
    bk_weight *w = expert_mat(m, l, e, k);
    bk_weight_release(m->be, w);
    *w = c->host[((int64_t)l * c->n_experts + e) * 3 + k]; /* the file's bytes again (a device copy pointed elsewhere) */
    if (s->mapped) hmmap_drop(w->data, (size_t)stored_bytes(w)); /* a copy of ours stays as it is */
  }
  s->resident = false;
  __atomic_fetch_sub(&c->resident, s->bytes, __ATOMIC_RELAXED); /* read by model_expert_stats_of on any thread */
  __atomic_fetch_add(&c->evictions, 1, __ATOMIC_RELAXED);
}

int experts_acquire(model *m, int l, const bk_tensor *ids, herr *err) {
  expert_cache *c = &m->xc;
  int64_t n = bk_nelem(ids);
  if (n > c->cap_ids && !HGROW(c->ids, c->cap_ids, n)) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  int rc = bk_get(ids, 0, c->ids, sizeof(int32_t) * (size_t)n, err);
  if (rc) return rc;
  for (int64_t i = 0; i < n; i++) {
    int32_t e = c->ids[i];
    if (e < 0 || e >= c->n_experts) continue; /* contributes nothing (bk_moe) */
    int32_t at = (int32_t)((int64_t)l * c->n_experts + e);
    expert_slot *s = &c->slots[at];
    if (s->resident) {
      lru_unlink(c, at);
      lru_push(c, at);
      continue;
    }
    for (int k = 0; k < 3; k++)
      if ((rc = bk_weight_load(m->be, expert_mat(m, l, e, k), BK_USE_MATMUL, err))) {
        while (--k >= 0) {
          bk_weight_release(m->be, expert_mat(m, l, e, k));
          *expert_mat(m, l, e, k) = c->host[(int64_t)at * 3 + k];
        }
        return herr_wrap(err, "layer %d expert %d", l, (int)e);
      }
    s->resident = true;
    __atomic_fetch_add(&c->resident, s->bytes, __ATOMIC_RELAXED);
    __atomic_fetch_add(&c->page_ins, 1, __ATOMIC_RELAXED);
    lru_push(c, at);
  }
  return 0;
}

void experts_trim(model *m) {
  expert_cache *c = &m->xc;
  while (c->resident > c->budget && c->head >= 0) {
    int32_t at = c->head;
    lru_unlink(c, at);
    release(m, at / c->n_experts, at % c->n_experts);
  }
}

void model_expert_stats_of(const model *m, model_expert_stats *out) {
  const expert_cache *c = &m->xc;
  *out = (model_expert_stats){c->budget, c->total, __atomic_load_n(&c->resident, __ATOMIC_RELAXED),
                              __atomic_load_n(&c->page_ins, __ATOMIC_RELAXED), __atomic_load_n(&c->evictions, __ATOMIC_RELAXED)};
}

int64_t model_expert_bytes(const model *m) {
  int64_t total = 0;
  for (int l = 0; l < m->cfg.num_hidden_layers; l++) {
    const layer_weights *lw = &m->layers[l];
    for (int64_t i = 0; lw->moe && i < 3 * lw->ex.n; i++) total += stored_bytes(&lw->experts[i]);
  }
  return total;
}
