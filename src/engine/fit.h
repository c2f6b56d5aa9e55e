/* fit.h — the memory contract (hearth_fit of include/hearth.h): what a model
 * needs in memory — weights as stored, the KV cache as the serving pool
 * lays it out, the forward's scratch — against what the device has, the
 * largest context that fits, and a decode speed predicted from a measured
 * memory bandwidth. */
#ifndef HEARTH_ENGINE_FIT_H
#define HEARTH_ENGINE_FIT_H

#include <stdint.h>

#include "backend/backend.h"
#include "base/status.h"
#include "engine/kv_quant.h"
#include "hearth.h"

/* The fit of the model at path. q (borrowed, may be NULL): each layer's K / V
 * storage, as a loaded engine has it (NULL: made from o->kv_quant and
 * o->kv_quant_config, as a load would); be (borrowed, may be NULL): the
 * device whose free memory and bandwidth count (NULL: o->device's, opened
 * for the measurement); held: bytes a loaded model holds already, counted as
 * available; *bandwidth (may be NULL): a bandwidth measured before (> 0) is
 * used as it is, else measured and stored there. */
int fit_model(const char *path, const hearth_fit_opts *o, const kv_quant *q, bk_backend *be, int64_t held,
              double *bandwidth, hearth_fit_result *out, herr *err);

/* Bytes per second: on the host (be NULL or a CPU backend) a read of a
 * buffer of `bytes` by `threads` threads (<= 0: one per CPU), the best of a
 * few passes; on a GPU a device-to-device copy (read + write counted). 0 when
 * it cannot be measured (no memory). */
double fit_bandwidth(bk_backend *be, int threads, size_t bytes);

#endif
