/* select.c — which files of a repository a runtime needs, and which GGUF a
 * quant tag names. Owns the default choice (configs, tokenizer, chat template,
 * safetensors with their index; or one GGUF model in a GGUF repository),
 * --include / --exclude globs (fnmatch) and llama.cpp's `-hf ORG/NAME:QUANT`
 * rule: the GGUF whose name carries the tag, a split set whole. */
#include <ctype.h>
#include <fnmatch.h>
#include <stdlib.h>
#include <string.h>

#include "hub/hub.h"

static const char *base_name(const char *p) {
  const char *s = strrchr(p, '/');
  return s ? s + 1 : p;
}

static bool ends_with(const char *s, const char *suf) {
  size_t a = strlen(s), b = strlen(suf);
  return a >= b && !strcmp(s + a - b, suf);
}

bool hub_name_has_quant(const char *name, const char *tag) {
  const char *b = base_name(name);
  size_t n = strlen(b), t = strlen(tag);
  if (!t) return false;
  for (size_t i = 0; i + t <= n; i++) {
    if (strncasecmp(b + i, tag, t)) continue;
    bool left = i == 0 || !isalnum((unsigned char)b[i - 1]);
    bool right = i + t == n || !isalnum((unsigned char)b[i + t]);
    /* "Q4_K" is not in "Q4_K_M": an underscore and more letters continue the tag */
    if (right && b[i + t] == '_' && isalnum((unsigned char)b[i + t + 1])) right = false;
    if (left && right) return true;
  }
  return false;
}

/* "-00001-of-00003.gguf": the shard number, else 0. */
static int gguf_shard(const char *name) {
  const char *b = base_name(name);
  const char *p = strstr(b, "-of-");
  if (!p || p - b < 6 || p[-6] != '-') return 0;
  for (int i = 1; i <= 5; i++)
    if (!isdigit((unsigned char)p[-i])) return 0;
  return atoi(p - 5);
}

bool hub_gguf_is_later_shard(const char *name) { return gguf_shard(name) > 1; }

/* The name of a split set without its "-NNNNN-of-NNNNN.gguf" (len into *n), so shards compare equal. */
static size_t gguf_stem_len(const char *name) {
  size_t n = strlen(name);
  if (gguf_shard(name)) {
    const char *p = strstr(base_name(name), "-of-");
    return (size_t)(p - 6 - name);
  }
  return n;
}

static bool is_gguf(const char *name) { return ends_with(name, ".gguf"); }
static bool is_mmproj(const char *name) { return strncasecmp(base_name(name), "mmproj", 6) == 0; }

/* A top-level file (or a sentence-transformers pooling config) that a runtime reads beside the weights. */
static bool is_runtime_file(const char *name) {
  if (!fnmatch("[0-9]*_Pooling/config.json", name, FNM_PATHNAME)) return true;
  if (strchr(name, '/')) return false;
  static const char *globs[] = {"*config.json", "tokenizer*", "special_tokens_map.json", "chat_template.*",
                                "modules.json", "*.safetensors", "*.safetensors.index.json"};
  for (size_t i = 0; i < sizeof globs / sizeof globs[0]; i++)
    if (!fnmatch(globs[i], name, FNM_PATHNAME)) return true;
  return false;
}

int hub_select(const hub_revision *r, const hub_select_opts *o, bool *keep, herr *err) {
  bool any_st = false, any_gguf = false;
  for (size_t i = 0; i < r->n; i++) {
    keep[i] = false;
    const char *nm = r->files[i].name;
    if (!strchr(nm, '/') && ends_with(nm, ".safetensors")) any_st = true;
    if (is_gguf(nm) && !is_mmproj(nm)) any_gguf = true;
  }
  const char *quant = o && o->quant && o->quant[0] ? o->quant : NULL;
  if (o && o->ninclude) {
    for (size_t i = 0; i < r->n; i++)
      for (size_t k = 0; k < o->ninclude && !keep[i]; k++) keep[i] = !fnmatch(o->include[k], r->files[i].name, 0);
  } else if (any_gguf && (quant || !any_st)) {
    /* one GGUF model: by tag, else Q4_K_M (llama.cpp's default), else the first; a split set whole */
    const char *tag = quant ? quant : "Q4_K_M";
    ssize_t pick = -1;
    for (size_t i = 0; i < r->n && pick < 0; i++) {
      const char *nm = r->files[i].name;
      if (is_gguf(nm) && !is_mmproj(nm) && !hub_gguf_is_later_shard(nm) && hub_name_has_quant(nm, tag)) pick = (ssize_t)i;
    }
    if (pick < 0 && quant) {
      char tags[512] = "";
      size_t used = 0;
      for (size_t i = 0; i < r->n && used + 80 < sizeof tags; i++) {
        const char *nm = r->files[i].name;
        if (!is_gguf(nm) || is_mmproj(nm) || hub_gguf_is_later_shard(nm)) continue;
        used += (size_t)snprintf(tags + used, sizeof tags - used, "%s%s", used ? ", " : "", base_name(nm));
      }
      return herr_set(err, HEARTH_ENOTFOUND, "no GGUF file with the tag %s in this repository (its GGUF files: %s)", quant,
                      tags);
    }
    for (size_t i = 0; i < r->n && pick < 0; i++) {
      const char *nm = r->files[i].name;
      if (is_gguf(nm) && !is_mmproj(nm) && !hub_gguf_is_later_shard(nm)) pick = (ssize_t)i;
    }
    if (pick < 0) /* only later parts of split files */
      return herr_set(err, HEARTH_EFORMAT, "the repository's GGUF files are parts of a split file without its first part");
    const char *chosen = r->files[pick].name;
    size_t stem = gguf_stem_len(chosen);
    bool split = gguf_shard(chosen) != 0;
    for (size_t i = 0; i < r->n; i++) {
      const char *nm = r->files[i].name;
      if (i == (size_t)pick) keep[i] = true;
      else if (split && gguf_shard(nm) && gguf_stem_len(nm) == stem && !strncmp(nm, chosen, stem)) keep[i] = true;
    }
  } else {
    if (quant)
      return herr_set(err, HEARTH_ENOTFOUND, "this repository has no GGUF files to pick with :%s (drop the tag to fetch its safetensors)", quant);
    for (size_t i = 0; i < r->n; i++) keep[i] = is_runtime_file(r->files[i].name);
  }
  if (o)
    for (size_t i = 0; i < r->n; i++)
      for (size_t k = 0; k < o->nexclude && keep[i]; k++)
        if (!fnmatch(o->exclude[k], r->files[i].name, 0)) keep[i] = false;
  return 0;
}
