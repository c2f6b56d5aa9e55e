/* pool.h — a fixed thread pool that runs parallel-for loops.
 *
 * hpool_for(p, n, fn, ctx) calls fn(ctx, i, tid) for every i in [0, n),
 * spread over the pool's threads (the caller is thread 0), and returns when
 * all calls are done. Calls from several threads at once are serialised.
 * Every call runs with denormals flushed to zero (see hpool_flush_begin).
 *
 * Waiting threads spin briefly, then yield the CPU, then sleep: on a machine
 * with more runnable threads than cores the thread holding the work still
 * gets to run.
 */
#ifndef HEARTH_BASE_POOL_H
#define HEARTH_BASE_POOL_H

typedef struct hpool hpool;
typedef void (*hpool_fn)(void *ctx, int i, int tid);

/* nthreads <= 0 means one per online CPU. Returns NULL on failure. */
hpool *hpool_create(int nthreads);
void hpool_destroy(hpool *p);
int hpool_size(const hpool *p);
void hpool_for(hpool *p, int n, hpool_fn fn, void *ctx);
/* Number of online CPUs (at least 1). */
int hpool_cpu_count(void);

/* Flush-to-zero and denormals-are-zero for the calling thread (x86 MXCSR
 * FTZ|DAZ, AArch64 FPCR.FZ): denormal floats, which attention's
 * exponentials and tiny activations produce, otherwise cost ~100x per
 * operation. hpool_flush_begin returns the previous mode for
 * hpool_flush_end. The pool's workers run flushed; hpool_for flushes the
 * caller while it computes; the CPU backend's ops do the same. */
typedef unsigned long hpool_fpmode;
hpool_fpmode hpool_flush_begin(void);
void hpool_flush_end(hpool_fpmode old);
/* Whether the calling thread flushes denormals now (for tests). */
int hpool_flushing(void);

#endif
