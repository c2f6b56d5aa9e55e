/* pool.h — a fixed thread pool that runs parallel-for loops.
 *
 * hpool_for(p, n, fn, ctx) calls fn(ctx, i, tid) for every i in [0, n),
 * spread over the pool's threads (the caller is thread 0), and returns when
 * all calls are done. Calls from several threads at once are serialised.
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

#endif
