/* engine_hearth.h — the memory pipeline's engine over a loaded hearth model
 * (hearth.h): each call's prompt rendered as one user turn with the model's
 * chat template, decoded greedily under the stage's JSON schema and LoRA
 * adapter. A stage's calls go as one hearth_generate_batch when they share
 * the stage and the token limit; where they do not (a prompt so long that its
 * limit was cut to what the context leaves), one at a time. */
#ifndef HEARTH_MEMORY_ENGINE_HEARTH_H
#define HEARTH_MEMORY_ENGINE_HEARTH_H

#include "hearth.h"
#include "memory/memory.h"

typedef struct mem_hearth {
  hearth_model *model;                 /* borrowed */
  bool adapter[MEM_STAGES];            /* stage s runs under the adapter "memory-<stage>" */
  int64_t context;
  char id[2048];                       /* the model and adapters, for the run key */
  int batches, singles;                /* batches run whole; calls run one at a time */
} mem_hearth;

/* Sets h up on model (found at model_path, which names it in the run key);
 * adapters[s] (may be NULL) is a PEFT folder loaded as stage s's adapter. */
int mem_hearth_init(mem_hearth *h, hearth_model *model, const char *model_path, const char *const adapters[MEM_STAGES],
                    herr *err);
/* The engine that runs calls on h (h must outlive it). */
mem_engine mem_hearth_engine(mem_hearth *h);

#endif
