/* mm.h — media encoders ("towers") beside a language model: what turns a
 * decoded image, sound or video (media/media.h) into rows of the language
 * model's input embeddings.
 *
 * A tower is loaded by model_load from the same folder as the language
 * model (its weights in the same safetensors files, on the same backend),
 * when config.json has the sub-config it reads (vision_config,
 * audio_config). A model has at most one tower per media kind
 * (model_tower); a kind without one is refused by the caller ("model X has
 * no vision tower").
 *
 * The life of one medium in a prompt:
 *   1. the chat template writes the tower's placeholder (mm_placeholder:
 *      the string Hugging Face's template emits for {"type": "image"} etc.);
 *   2. mm_prepare does what the Hugging Face processor does to it: resize,
 *      rescale, normalise, patches (or mel features), and says how many
 *      soft tokens it becomes and the text that replaces the placeholder
 *      (begin marker, n soft tokens, end marker, plus any text the processor
 *      adds such as video timestamps). This needs no backend and runs on any
 *      thread;
 *   3. the caller tokenizes the prompt with that text in place of the
 *      placeholder; the rows whose id is prep.soft_id, in order, are the
 *      medium's soft tokens (exactly prep.n_tokens of them);
 *   4. mm_encode runs the tower on the model's backend (under the model's
 *      lock: any thread, serialized with forwards) and gives n_tokens rows of
 *      text_hidden floats, already through the model's projection into the
 *      text embedding space, plus what the language model needs per token
 *      (three-axis positions for multimodal RoPE);
 *   5. the rows ride along in model_seq.embeds in document order: each media
 *      row replaces its token's embedding.
 *
 * Writing a tower: fill an mm_tower_ops (below) in model/<family>_<kind>.c
 * and list it in mm.c's table. Weights come through load.c's functions
 * (model_matrix, model_vector with a weight_src whose prefix is NULL, so
 * names are the file's own: "model.vision_tower.encoder.layers.0...."),
 * owned and released with the model. */
#ifndef HEARTH_MODEL_MM_H
#define HEARTH_MODEL_MM_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"
#include "media/media.h"
#include "model/model.h"

/* One medium as the processor leaves it, ready for mm_encode. */
typedef struct mm_prep {
  media_kind kind;
  int64_t n_tokens;   /* soft tokens it encodes to (embedding rows) */
  char *text;         /* owned: what replaces the tower's placeholder in the rendered prompt (special tokens written
                         out: "<start_of_image><image>...<image><end_of_image>"); tokenized with special tokens */
  int32_t soft_id;    /* the soft token's id: the rows of the tokenized text with this id take the embeddings, in order */
  /* The processor's tensors, in the tower's layout (tests compare them with the reference's):
   * Gemma-4 vision: values [patches, 3 * p * p] (pixel_values), pos [patches, 2] (image_position_ids: x, y);
   * Gemma-4 audio: values [frames, mel] (input_features), pos NULL;
   * Qwen3.5 vision: values [patches, C * T * p * p] (pixel_values), pos NULL, grid = (t, h, w). */
  float *values;      /* owned */
  int64_t rows, cols;
  int32_t *pos;       /* owned, may be NULL: rows * pos_cols integers */
  int64_t pos_cols;
  int64_t grid[3];    /* patch grid (t, h, w) where the tower has one; else 0 */
  void *priv;         /* owned by the tower (freed through its ops.prep_free), may be NULL */
  const struct mm_tower *tower; /* borrowed: who made it */
} mm_prep;

/* What mm_encode gives for one medium. */
typedef struct mm_embeds {
  int64_t n_tokens, dim;  /* dim = the text model's hidden_size */
  float *rows;            /* owned: n_tokens * dim host floats, in the order of the soft tokens */
  int32_t *pos3;          /* owned, may be NULL: n_tokens * 3 integers (t, h, w per token) — the multimodal RoPE
                             position of each soft token relative to the span's first position (Qwen3.5) */
  int64_t pos_span;       /* positions the span takes: the next text token's position is the span's first plus this
                             (n_tokens without pos3) */
  bool bidirectional;     /* the soft tokens see each other both ways where the language model allows it
                             (Gemma-4 images and video frames on sliding layers) */
} mm_embeds;

typedef struct mm_tower mm_tower;

/* The model's tower for kind, or NULL when it has none. */
const mm_tower *model_tower(const model *m, media_kind kind);
/* MEDIA_BIT of every kind the model takes (0: text only). */
unsigned model_media_kinds(const model *m);
/* "gemma4_vision", "gemma4_audio", "qwen3_5_vision". */
const char *mm_tower_name(const mm_tower *t);
/* The string the chat template writes for one medium of kind k (the
 * processor's image / audio / video token), which mm_prep.text replaces. */
const char *mm_placeholder(const mm_tower *t, media_kind k);
/* How the video decoder should sample frames for this tower. */
void mm_video_opts(const mm_tower *t, media_video_opts *out);
/* Step 2 above. Errors (HEARTH_EINVAL) name what is wrong with the medium
 * ("image of 3 x 70000 pixels: aspect ratio beyond ..."). */
int mm_prepare(const mm_tower *t, const media *in, mm_prep *out, herr *err);
void mm_prep_free(mm_prep *p);
/* Step 4. */
int mm_encode(model *m, const mm_prep *p, mm_embeds *out, herr *err);
void mm_embeds_free(mm_embeds *e);

/* ---- for towers ---- */

typedef struct weight_src weight_src;

typedef struct mm_tower_ops {
  const char *name;           /* "gemma4_vision" */
  const char *config_key;     /* the sub-config of config.json it reads: "vision_config", "audio_config" */
  unsigned kinds;             /* MEDIA_BIT(...) of what it takes */
  /* Whether it is the tower for this config.json (root) — e.g. its model_type and the sub-config's. */
  bool (*match)(const json_t *root);
  /* Reads its config and weights (through load.c's functions on m, which own what they load);
   * *state is its own (freed by free). 0 with *state NULL: the folder holds none of its weights
   * (a checkpoint whose tower was left out): the model takes no media of its kinds. */
  int (*load)(model *m, const weight_src *src, const json_t *root, void **state, herr *err);
  const char *(*placeholder)(const void *state, media_kind k);
  void (*video_opts)(const void *state, media_video_opts *out);   /* NULL: no video */
  int (*prepare)(const void *state, const media *in, mm_prep *out, herr *err);
  void (*prep_free)(mm_prep *p);                                   /* NULL: nothing in priv */
  /* Runs on m's backend with m's lock held. */
  int (*encode)(model *m, void *state, const mm_prep *p, mm_embeds *out, herr *err);
  void (*free)(model *m, void *state);
} mm_tower_ops;

/* The towers mm.c knows. */
extern const mm_tower_ops gemma4_vision_tower;
extern const mm_tower_ops qwen3_5_vision_tower;
extern const mm_tower_ops gemma4_audio_tower;

/* PIL's Image.resize(..., BICUBIC) of an RGB8 image (Pillow's Resample.c, bit for bit): dst ow x oh. */
int mm_resize_pil(uint8_t *dst, int ow, int oh, const uint8_t *src, int iw, int ih, herr *err);
/* Gemma 4's processor: the size (height, width) an image of h x w is resized to (get_aspect_ratio_preserving_size). */
int gemma4_image_size(int h, int w, int patch, int64_t max_patches, int k, int *oh, int *ow, herr *err);
/* Gemma 4's image processor on an RGB8 image: resized to that size (PIL's bicubic when pil — the PIL
 * processor —, else torchvision's antialiased bicubic on uint8 — Gemma4ImageProcessor, what
 * AutoImageProcessor loads), rescaled (numpy's double then f32 when pil, torch's f32 product
 * otherwise; rescale 1: not), cut into patches (row, column, channel) with their (x, y) positions.
 * *values [n_patches, 3 patch^2] and *pos [n_patches, 2]: malloc'ed. */
int gemma4_image_patches(const media_image *im, int patch, int k, int64_t max_soft, bool pil, double rescale, float **values,
                         int32_t **pos, int64_t *n_patches, int *oh, int *ow, herr *err);

/* Loads every tower config.json asks for (model_load calls it). */
int mm_towers_load(model *m, const weight_src *src, const char *dir, herr *err);
void mm_towers_free(model *m);

#endif
