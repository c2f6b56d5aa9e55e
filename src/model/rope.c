/* rope.c — rotary inverse frequencies and attention scaling for each RoPE
 * variant (see rope.h). Owns only the math of the tables; knows nothing of
 * layers or the forward pass. */
#include "model/rope.h"

#include <math.h>
#include <stdlib.h>

static double yarn_mscale(double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * log(scale) + 1.0; }

static double yarn_correction_dim(double rotations, double dim, double base, double max_pos) {
  return dim * log(max_pos / (rotations * 2 * M_PI)) / (2 * log(base));
}

int rope_table_init(rope_table *t, const rope_config *r, int64_t head_dim, int64_t max_pos, double mscale,
                    double mscale_all_dim, herr *err) {
  t->rot_dim = r->kind == ROPE_PROPORTIONAL ? head_dim : (int64_t)(head_dim * r->partial_rotary_factor);
  t->rot_dim -= t->rot_dim % 2;
  t->attn_scale = 1.0;
  t->interleaved = false;
  t->n_axes = 0;
  t->axis = NULL;
  int64_t half = t->rot_dim / 2;
  t->inv_freq = calloc(half ? (size_t)half : 1, sizeof(double));
  if (!t->inv_freq) return herr_set(err, HEARTH_ENOMEM, "out of memory for rope table");
  double dim = (double)t->rot_dim;
  for (int64_t i = 0; i < half; i++) t->inv_freq[i] = 1.0 / pow(r->theta, (double)(2 * i) / dim);
  switch (r->kind) {
    case ROPE_DEFAULT: break;
    case ROPE_PROPORTIONAL: { /* pairs (i, i + head_dim/2) over the whole head; only the first `angles` turn */
      int64_t angles = (int64_t)floor(r->partial_rotary_factor * (double)head_dim / 2);
      for (int64_t i = 0; i < half; i++) t->inv_freq[i] = i < angles ? t->inv_freq[i] / r->factor : 0.0;
      break;
    }
    case ROPE_LINEAR:
      for (int64_t i = 0; i < half; i++) t->inv_freq[i] /= r->factor;
      break;
    case ROPE_LLAMA3: {
      double old = (double)r->original_max_position;
      double low_wl = old / r->low_freq_factor, high_wl = old / r->high_freq_factor;
      for (int64_t i = 0; i < half; i++) {
        double f = t->inv_freq[i], wl = 2 * M_PI / f;
        if (wl > low_wl) f = f / r->factor;
        else if (!(wl < high_wl)) { /* medium: smooth between scaled and unscaled */
          double smooth = (old / wl - r->low_freq_factor) / (r->high_freq_factor - r->low_freq_factor);
          f = (1 - smooth) * f / r->factor + smooth * f;
        }
        t->inv_freq[i] = f;
      }
      break;
    }
    case ROPE_FACTORS: /* llama.cpp's ggml_rope_ext: theta_i / freq_factors[i] */
      if (r->n_freq_factors != half) {
        rope_table_free(t);
        return herr_set(err, HEARTH_EFORMAT, "RoPE frequency factors: %d given for %lld rotated pairs", r->n_freq_factors,
                        (long long)half);
      }
      for (int64_t i = 0; i < half; i++) t->inv_freq[i] /= (double)r->freq_factors[i];
      break;
    case ROPE_YARN: {
      double orig = r->original_max_position > 0 ? (double)r->original_max_position : (double)max_pos;
      if (!(orig > 0)) {
        rope_table_free(t);
        return herr_set(err, HEARTH_EFORMAT, "yarn rope scaling needs original_max_position_embeddings or max_position_embeddings");
      }
      double factor = r->factor;
      if (r->attention_factor > 0) t->attn_scale = r->attention_factor;
      else if (mscale > 0 && mscale_all_dim > 0) t->attn_scale = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim);
      else t->attn_scale = yarn_mscale(factor, 1.0);
      double lo = floor(yarn_correction_dim(r->beta_fast, dim, r->theta, orig));
      double hi = ceil(yarn_correction_dim(r->beta_slow, dim, r->theta, orig));
      if (lo < 0) lo = 0;
      if (hi > dim - 1) hi = dim - 1;
      if (lo == hi) hi += 0.001;
      for (int64_t i = 0; i < half; i++) {
        double ramp = ((double)i - lo) / (hi - lo);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        double extrap = 1 - ramp; /* weight of the unscaled frequency */
        double f = t->inv_freq[i];
        t->inv_freq[i] = (f / factor) * (1 - extrap) + f * extrap;
      }
      break;
    }
    default:
      rope_table_free(t);
      return herr_set(err, HEARTH_EUNSUPPORTED, "rope type %d is not supported", (int)r->kind);
  }
  return 0;
}

void rope_table_free(rope_table *t) {
  free(t->inv_freq);
  free(t->axis);
  t->inv_freq = NULL;
  t->axis = NULL;
  t->n_axes = 0;
}
