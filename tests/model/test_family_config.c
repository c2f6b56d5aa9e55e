/* test_family_config.c — the config.json keys a family reads itself (its
 * file in src/model, from config.c's raw object) when a model is loaded:
 * Gemma 4's per-layer geometry, per-layer inputs, KV sharing and MoE block,
 * DiffusionGemma's canvas, Qwen3.5's linear attention and experts, GLM-5's
 * and Qwen3-MoE's experts, Granite's multipliers; the golden fixtures and
 * written configs, loaded for their geometry only (no weights), and the
 * errors that name the key. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/gemma4.h"
#include "model/internal.h"
#include "model/model.h"
#include "model/qwen3_5.h"
#include "test.h"

#define GOLDEN HEARTH_SOURCE_DIR "/tests/fixtures/golden/"

#define BASE "\"vocab_size\": 100, \"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 6, \"num_attention_heads\": 4"

static char tmpdir[64];

static int load_dir(const char *dir, model **m, herr *err) {
  *m = NULL;
  return model_load(dir, &(model_load_opts){.threads = 1, .geometry_only = true}, m, err);
}

/* Loads the geometry of a folder holding only config.json = text. */
static int load_text(const char *text, model **m, herr *err) {
  char p[128];
  snprintf(p, sizeof p, "%s/config.json", tmpdir);
  FILE *f = fopen(p, "w");
  if (!f) return -1;
  fputs(text, f);
  fclose(f);
  return load_dir(tmpdir, m, err);
}

static const gemma4_state *g4(const model *m) { return (const gemma4_state *)m->fam_state; }

static void test_gemma4(void) {
  model *m;
  herr err = {0};
  CHECK_MSG(load_dir(GOLDEN "gemma4-f32", &m, &err) == 0, "%s", err.msg);
  if (m) {
    const model_config *c = model_cfg(m);
    CHECK(c->rope.kind == ROPE_PROPORTIONAL && c->rope.partial_rotary_factor == 0.25 && c->rope.theta == 1e6 && c->rope.factor == 1);
    CHECK(c->rope_local.kind == ROPE_DEFAULT && c->rope_local.theta == 1e4 && c->rope_local.partial_rotary_factor == 1);
    CHECK_EQ_INT(c->layer_head_dim[0], 16);
    CHECK_EQ_INT(c->layer_head_dim[1], 32);
    CHECK_EQ_INT(c->layer_head_dim[3], 32);
    CHECK_EQ_INT(c->layer_kv_heads[1], 2);
    CHECK_EQ_INT(g4(m)->ple_dim, 16);
    CHECK_EQ_INT(g4(m)->kv_shared, 2);
    CHECK(g4(m)->double_wide && !g4(m)->k_eq_v && c->num_experts == 0 && !c->moe_layer[0]);
    CHECK(c->final_logit_softcapping == 30.0);
    CHECK_EQ_INT(model_canvas_length(m), 0);
    model_free(m);
  }
  CHECK_MSG(load_dir(GOLDEN "gemma4_moe-f32", &m, &err) == 0, "%s", err.msg);
  if (m) {
    const model_config *c = model_cfg(m);
    CHECK_EQ_INT(c->layer_kv_heads[2], 1);
    CHECK_EQ_INT(c->layer_kv_heads[0], 2);
    CHECK(g4(m)->k_eq_v && c->num_experts == 4 && c->num_experts_per_tok == 2 && c->moe_layer[0] && c->moe_layer[2]);
    CHECK(c->norm_topk_prob);
    model_free(m);
  }
  /* defaults: proportional RoPE, global_head_dim 512 on full layers, the last layer full */
  CHECK(load_text("{\"model_type\": \"gemma4_text\", " BASE ", \"layer_types\": [\"sliding_attention\", \"full_attention\", "
                  "\"sliding_attention\", \"sliding_attention\", \"sliding_attention\", \"sliding_attention\"]}", &m, &err) == 0);
  if (m) {
    const model_config *c = model_cfg(m);
    CHECK(c->rope.kind == ROPE_PROPORTIONAL && c->rope.partial_rotary_factor == 0.25);
    CHECK_EQ_INT(c->layer_head_dim[0], 256);
    CHECK_EQ_INT(c->layer_head_dim[1], 512);
    CHECK(c->layer_types[5] == LAYER_FULL);
    CHECK_EQ_INT(c->layer_head_dim[5], 512);
    model_free(m);
  }
}

/* DiffusionGemma: the text stack's config under text_config (a Gemma 4 MoE stack whose full layers
 * always take keys as values, no per-layer inputs), canvas_length at the top (256 by default), the
 * final softcap of 30 that config.json does not state; a bidirectional encoder is refused. */
static void test_diffusion_gemma(void) {
  model *m;
  herr err = {0};
  CHECK(load_text("{\"model_type\": \"diffusion_gemma\", \"canvas_length\": 8, \"tie_word_embeddings\": true, \"text_config\": {"
                  "\"model_type\": \"diffusion_gemma_text\", " BASE ", \"num_key_value_heads\": 2, \"head_dim\": 16, "
                  "\"sliding_window\": 8, \"per_layer_config\": {\"5\": {\"head_dim\": 32, \"num_key_value_heads\": 1}}, "
                  "\"num_experts\": 4, \"top_k_experts\": 2, \"moe_intermediate_size\": 16, \"eos_token_id\": 2}}",
                  &m, &err) == 0);
  if (m) {
    const model_config *c = model_cfg(m);
    CHECK_EQ_STR(c->model_type, "diffusion_gemma_text");
    CHECK_EQ_INT(model_canvas_length(m), 8);
    CHECK(g4(m)->k_eq_v);
    CHECK_EQ_INT(g4(m)->ple_dim, 0);
    CHECK_EQ_INT(c->num_experts, 4);
    CHECK_EQ_INT(c->num_experts_per_tok, 2);
    CHECK(c->moe_layer[0] && c->moe_layer[5]);
    CHECK_EQ_INT(c->layer_types[0], LAYER_SLIDING);
    CHECK_EQ_INT(c->layer_types[5], LAYER_FULL);
    CHECK_EQ_INT(c->layer_head_dim[5], 32);
    CHECK_EQ_INT(c->layer_kv_heads[5], 1);
    CHECK_NEAR(c->final_logit_softcapping, 30.0, 0);
    CHECK_EQ_INT(c->rope.kind, ROPE_PROPORTIONAL);
    model_free(m);
  }
  /* an autoregressive model has no canvas */
  CHECK(load_text("{\"model_type\": \"gemma4_text\", " BASE ", \"hidden_size_per_layer_input\": 0}", &m, &err) == 0);
  if (m) CHECK_EQ_INT(model_canvas_length(m), 0);
  model_free(m);
  CHECK(load_text("{\"model_type\": \"diffusion_gemma\", \"text_config\": {\"model_type\": \"diffusion_gemma_text\", " BASE
                  ", \"num_experts\": 4, \"top_k_experts\": 2, \"moe_intermediate_size\": 16}}", &m, &err) == 0);
  if (m) CHECK_EQ_INT(model_canvas_length(m), 256);
  model_free(m);
  CHECK_EQ_INT(load_text("{\"model_type\": \"diffusion_gemma\", \"text_config\": {\"model_type\": \"diffusion_gemma_text\", " BASE
                         ", \"num_experts\": 4, \"top_k_experts\": 2, \"moe_intermediate_size\": 16, "
                         "\"use_bidirectional_attention\": \"all\"}}", &m, &err),
               HEARTH_EUNSUPPORTED);
  CHECK(strstr(err.msg, "use_bidirectional_attention") != NULL);
}

/* Qwen3.5: the linear-attention sizes (on each linear layer), the MoE variant's experts and shared
 * expert; value heads a multiple of key heads. */
static void test_qwen3_5(void) {
  model *m;
  herr err = {0};
  CHECK_MSG(load_dir(GOLDEN "qwen3_5-f32", &m, &err) == 0, "%s", err.msg);
  if (m) {
    const model_config *c = model_cfg(m);
    const layer_weights *lw = &m->layers[0];
    CHECK(lw->linear && !m->layers[1].linear);
    CHECK_EQ_INT(lw->conv_kernel, 3);
    CHECK_EQ_INT(lw->lin_k_dim, 16);
    CHECK_EQ_INT(lw->lin_v_dim, 8);
    CHECK_EQ_INT(lw->lin_k_heads, 2);
    CHECK_EQ_INT(lw->lin_v_heads, 4);
    CHECK_EQ_INT(lw->state_dim, (3 - 1) * (2 * 2 * 16 + 4 * 8) + 4 * 16 * 8);
    CHECK(c->num_experts == 0);
    model_free(m);
  }
  CHECK_MSG(load_dir(GOLDEN "qwen3_5_moe-f32", &m, &err) == 0, "%s", err.msg);
  if (m) {
    const model_config *c = model_cfg(m);
    CHECK(c->num_experts == 8 && c->num_experts_per_tok == 2 && c->moe_intermediate_size == 32 && c->norm_topk_prob);
    CHECK(qwen3_5_shared_inter(m) == 48 && c->moe_layer[0] && c->moe_layer[2]);
    CHECK_EQ_INT(m->layers[1].inter, 48);
    model_free(m);
  }
  /* defaults: 256 experts of 8 per token, a shared expert of 512 */
  CHECK(load_text("{\"model_type\": \"qwen3_5_moe\", \"eos_token_id\": 7, \"dtype\": \"bfloat16\", \"text_config\": "
                  "{\"model_type\": \"qwen3_5_moe_text\", \"vocab_size\": 100, \"hidden_size\": 64, \"num_hidden_layers\": 8, "
                  "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"rope_parameters\": {\"rope_type\": \"default\", "
                  "\"rope_theta\": 10000000, \"mrope_section\": [11, 11, 10], \"mrope_interleaved\": true}}}", &m, &err) == 0);
  if (m) {
    const model_config *c = model_cfg(m);
    CHECK_EQ_INT(c->num_experts, 256);
    CHECK_EQ_INT(c->num_experts_per_tok, 8);
    CHECK_EQ_INT(qwen3_5_shared_inter(m), 512);
    CHECK_EQ_INT(m->layers[0].lin_v_heads, 32);
    model_free(m);
  }
  CHECK_EQ_INT(load_text("{\"model_type\": \"qwen3_5_text\", " BASE ", \"linear_num_key_heads\": 3, \"linear_num_value_heads\": 4}",
                         &m, &err),
               HEARTH_EFORMAT);
  CHECK(strstr(err.msg, "linear_num_value_heads") != NULL);
}

/* glm_moe_dsa: n_routed_experts, dense layers by first_k_dense_replace (default 3) or
 * mlp_layer_types, every layer a deepseek_sparse_attention layer, norm_topk_prob on. */
static void test_glm5(void) {
  model *m;
  herr err = {0};
#define GLM "\"qk_rope_head_dim\": 8, \"index_head_dim\": 16, \"q_lora_rank\": 16, \"kv_lora_rank\": 16, \"qk_nope_head_dim\": 8, " \
            "\"v_head_dim\": 8, \"index_n_heads\": 2, \"index_topk\": 4"
  CHECK_MSG(load_text("{\"model_type\": \"glm_moe_dsa\", " BASE ", " GLM ", \"n_routed_experts\": 16, \"num_experts_per_tok\": 4, "
                      "\"moe_intermediate_size\": 32, \"layer_types\": [\"deepseek_sparse_attention\", \"deepseek_sparse_attention\", "
                      "\"deepseek_sparse_attention\", \"deepseek_sparse_attention\", \"deepseek_sparse_attention\", "
                      "\"deepseek_sparse_attention\"]}", &m, &err) == 0, "%s", err.msg);
  if (m) {
    const model_config *c = model_cfg(m);
    CHECK(c->num_experts == 16 && c->num_experts_per_tok == 4 && c->moe_intermediate_size == 32 && c->norm_topk_prob);
    CHECK(!c->moe_layer[0] && !c->moe_layer[2] && c->moe_layer[3] && c->moe_layer[5] && c->layer_types[4] == LAYER_FULL);
    CHECK(c->rms_norm_eps == 1e-5);
    model_free(m);
  }
  CHECK_MSG(load_text("{\"model_type\": \"glm_moe_dsa\", " BASE ", " GLM ", \"n_routed_experts\": 8, \"first_k_dense_replace\": 1, "
                      "\"mlp_layer_types\": [\"dense\", \"sparse\", \"dense\", \"sparse\", \"sparse\", \"sparse\"]}", &m, &err) == 0,
            "%s", err.msg);
  if (m) {
    const model_config *c = model_cfg(m);
    CHECK(!c->moe_layer[0] && c->moe_layer[1] && !c->moe_layer[2] && c->moe_layer[3]);
    model_free(m);
  }
  CHECK_EQ_INT(load_text("{\"model_type\": \"glm_moe_dsa\", " BASE ", " GLM ", \"mlp_layer_types\": [\"dense\", \"moe\", \"dense\", "
                         "\"sparse\", \"sparse\", \"sparse\"]}", &m, &err),
               HEARTH_EFORMAT);
  CHECK(strstr(err.msg, "mlp_layer_types[1]") != NULL);
#undef GLM
}

/* qwen3_moe: the experts' shape (num_local_experts for num_experts), decoder_sparse_step and
 * mlp_only_layers pick the expert layers. */
static void test_qwen3_moe(void) {
  model *m;
  herr err = {0};
  CHECK_MSG(load_dir(GOLDEN "qwen3_moe-f32", &m, &err) == 0, "%s", err.msg);
  if (m) {
    const model_config *c = model_cfg(m);
    CHECK_EQ_INT(c->num_experts, 8); /* spelled num_local_experts */
    CHECK_EQ_INT(c->num_experts_per_tok, 2);
    CHECK_EQ_INT(c->moe_intermediate_size, 32);
    CHECK(c->norm_topk_prob && c->moe_layer[0] && c->moe_layer[1]);
    model_free(m);
  }
  CHECK(load_text("{\"model_type\": \"qwen3_moe\", " BASE ", \"num_experts\": 4, \"num_experts_per_tok\": 2, "
                  "\"decoder_sparse_step\": 2, \"mlp_only_layers\": [3]}", &m, &err) == 0);
  if (m) {
    const model_config *c = model_cfg(m);
    CHECK(!c->moe_layer[0] && c->moe_layer[1] && !c->moe_layer[2] && !c->moe_layer[3] && c->moe_layer[5]);
    CHECK(!c->norm_topk_prob);
    model_free(m);
  }
}

/* granite: its four multipliers become the model's scales (embed_scale, residual_scale, logit_scale =
 * 1 / logits_scaling) and every layer's attention scale; absent, each is 1 (no scale at all, and an
 * attention scale of 1 rather than 1/sqrt(head_dim)). */
static void test_granite(void) {
  model *m;
  herr err = {0};
  CHECK_MSG(load_dir(GOLDEN "granite-f32", &m, &err) == 0, "%s", err.msg);
  if (m) {
    CHECK(m->embed_scale == 1.5f && m->residual_scale == 0.75f && m->logit_scale == 0.25f);
    CHECK(m->layers[0].attn_scale == 0.5f && m->layers[1].attn_scale == 0.5f);
    model_free(m);
  }
  CHECK(load_text("{\"model_type\": \"granite\", " BASE "}", &m, &err) == 0);
  if (m) {
    CHECK(m->embed_scale == 0 && m->residual_scale == 0 && m->logit_scale == 0);
    CHECK(m->layers[0].attn_scale == 1.0f && m->layers[5].attn_scale == 1.0f);
    model_free(m);
  }
}

/* Values out of range, named (by default a gemma4_text config). */
/* Every row: its hooks (those the decoder always calls, and the ones behind each capability it
 * claims and no others), its defaults, found by its name. */
static void test_rows(void) {
  int n = 0;
  for (const model_family *f; (f = model_family_at(n)); n++) {
    const family_ops *o = f->ops;
    CHECK_MSG(o && o->load_layer && o->layer, "%s: load_layer and layer", f->model_type);
    if (!o) continue;
    CHECK_MSG(f->split == (o->shard != NULL), "%s: split and shard", f->model_type);
    CHECK_MSG(f->canvas == (o->canvas != NULL), "%s: canvas", f->model_type);
    CHECK_MSG((f->mtp != NULL) == (o->mtp != NULL) && (f->mtp != NULL) == (o->mtp_of != NULL), "%s: mtp", f->model_type);
    CHECK_MSG(f->cfg.theta > 0 && f->cfg.eps > 0, "%s: rope_theta and rms_norm_eps defaults", f->model_type);
    CHECK_MSG(f->cfg.layers != CFG_LAYERS_PATTERN || f->cfg.every > 0, "%s: its layer pattern", f->model_type);
    CHECK(model_family_find(f->model_type) == f && model_type_supported(f->model_type));
  }
  CHECK(n >= 14);
  CHECK(!model_family_find("gpt2") && !model_family_find(NULL));
}

static void test_errors(void) {
  static const struct { const char *json, *names; int code; } bad[] = {
      {"\"num_kv_shared_layers\": 6", "num_kv_shared_layers", HEARTH_EFORMAT},
      {"\"hidden_size_per_layer_input\": 16, \"vocab_size_per_layer_input\": 50", "vocab_size_per_layer_input", HEARTH_EFORMAT},
      {"\"per_layer_config\": {\"9\": {\"head_dim\": 32}}", "per_layer_config", HEARTH_EFORMAT},
      {"\"per_layer_config\": {\"1\": {\"sliding_window\": 32}}", "sliding_window", HEARTH_EUNSUPPORTED},
      {"\"per_layer_config\": {\"1\": {\"num_key_value_heads\": 3}}", "num_key_value_heads", HEARTH_EFORMAT},
      {"\"enable_moe_block\": true, \"num_experts\": 4", "top_k_experts", HEARTH_EFORMAT},
      {"\"global_head_dim\": 7", "head_dim", HEARTH_EFORMAT},
      {"\"layer_types\": [\"full_attention\", \"full_attention\", \"full_attention\", \"full_attention\", \"sliding_attention\", "
       "\"sliding_attention\"], \"num_kv_shared_layers\": 2", "num_kv_shared_layers", HEARTH_EFORMAT},
      {"\"model_type\": \"qwen3_moe\", \"num_experts\": 4, \"num_experts_per_tok\": 5", "num_experts_per_tok", HEARTH_EFORMAT},
      {"\"model_type\": \"qwen3_moe\", \"num_experts\": 0", "num_experts", HEARTH_EFORMAT},
      {"\"model_type\": \"qwen3_moe\", \"moe_intermediate_size\": -1", "moe_intermediate_size", HEARTH_EFORMAT},
      {"\"model_type\": \"qwen3_moe\", \"decoder_sparse_step\": 0", "decoder_sparse_step", HEARTH_EFORMAT},
      {"\"model_type\": \"qwen3_moe\", \"mlp_only_layers\": [6]", "mlp_only_layers", HEARTH_EFORMAT},
      {"\"model_type\": \"granite\", \"logits_scaling\": 0", "logits_scaling", HEARTH_EFORMAT},
      {"\"model_type\": \"granite\", \"attention_multiplier\": \"0.5\"", "attention_multiplier", HEARTH_EFORMAT},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char text[1024];
    if (strstr(bad[i].json, "model_type")) snprintf(text, sizeof text, "{" BASE ", %s}", bad[i].json);
    else snprintf(text, sizeof text, "{\"model_type\": \"gemma4_text\", " BASE ", %s}", bad[i].json);
    model *m;
    herr err = {0};
    int rc = load_text(text, &m, &err);
    CHECK_MSG(rc == bad[i].code, "%s: got %d (%s)", bad[i].json, rc, err.msg);
    CHECK_MSG(rc && strstr(err.msg, bad[i].names), "%s: message '%s' does not name %s", bad[i].json, err.msg, bad[i].names);
    if (!rc) model_free(m);
  }
}

int main(void) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/hearth_famcfgXXXXXX");
  if (!mkdtemp(tmpdir)) return 1;
  RUN(test_gemma4);
  RUN(test_diffusion_gemma);
  RUN(test_qwen3_5);
  RUN(test_glm5);
  RUN(test_qwen3_moe);
  RUN(test_granite);
  RUN(test_rows);
  RUN(test_errors);
  char p[128];
  snprintf(p, sizeof p, "%s/config.json", tmpdir);
  unlink(p);
  rmdir(tmpdir);
  TEST_MAIN_END();
}
