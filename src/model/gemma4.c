#include "model/internal.h"
static int load_layer(model *m, const weight_src *src, int l, herr *err) { (void)m, (void)src, (void)l; return herr_set(err, HEARTH_EUNSUPPORTED, "todo"); }
static void layer(model *m, int l, const kv_store *kv, step *st) { (void)m, (void)l, (void)kv, (void)st; }
const family_ops gemma4_family_ops = {.load_layer = load_layer, .layer = layer};
