/* fuzz_kv_block — a KV store's block file (engine/kv_disk.h) over arbitrary
 * bytes: kv_disk_parse_block must refuse it with a message or hand out a
 * block whose tokens and payload lie inside the input; an accepted block
 * then goes into a pool. The store is one of a 3-layer pool with 4-token
 * blocks (row widths 4, 0, 8) for model 42, the shape of the seed's block. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/kv_disk.h"
#include "engine/kv_paged.h"

static kv_pool *pool;
static kv_disk *store;

static void setup(void) {
  model_kv_geometry g = {.n_layers = 3};
  g.kv_dim[0] = 4;
  g.kv_dim[2] = 8;
  herr e = {0};
  char dir[] = "/tmp/hearth-fuzz-kv-XXXXXX";
  if (!mkdtemp(dir) || kv_pool_new(&g, 4, 2, &pool, &e) || kv_disk_open(dir, 0, 42, pool, &store, &e)) abort();
  rmdir(dir); /* the store never touches its folder here */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!store) setup();
  unsigned char *copy = malloc(size ? size : 1); /* exactly size bytes: reading past them is caught */
  if (!copy) return 0;
  if (size) memcpy(copy, data, size);
  kv_disk_block b;
  herr e = {0};
  if (kv_disk_parse_block(store, copy, size, &b, &e) == 0) {
    size_t payload = kv_pool_block_payload(pool);
    if (b.payload < copy || b.payload + payload != copy + size || b.tokens < copy || b.tokens + 16 > b.payload) abort();
    volatile unsigned sum = 0;
    for (int i = 0; i < 16; i++) sum += b.tokens[i];
    (void)sum;
    if (kv_pool_block_write(pool, 1, b.payload, &e)) abort();
  } else if (!e.msg[0]) {
    abort();
  }
  free(copy);
  return 0;
}
