/* kv_disk.h — the prefix cache kept on disk (`--kv-store DIR`): full KV
 * blocks of a paged pool (kv_paged.h) written to files as the pool evicts
 * them and when it closes, and read back into the pool when a prompt's
 * prefix asks for a block the pool no longer has — also after a restart.
 *
 * One file per block, DIR/<hash>.kvb (16 hex digits of its chain hash):
 *
 *   offset  size  field
 *        0     8  magic "HKVBLOCK"
 *        8     4  format version (KV_DISK_VERSION), little-endian like the rest
 *       12     4  header bytes (everything before the payload)
 *       16     8  model identity (kv_disk_model_identity)
 *       24     8  chain hash of the block (the prefix cache's key: the tokens up to its end and
 *                 the adapter the chain was seeded with)
 *       32     8  parent hash
 *       40     4  depth (the block's index in its chain)
 *       44     4  block tokens B
 *       48     8  payload bytes
 *       56     8  checksum of the whole file with this field read as 0
 *       64     4  format descriptor bytes D
 *       68     D  format descriptor (kv_pool_format: element type, block size, row widths)
 *     68+D   4 B  the block's tokens (int32)
 *        H     P  payload: kv_pool_block_read's bytes
 *
 * A block read back is copied into the pool from the file's mapping when the
 * pool is in host memory (the CPU), or read into a buffer and uploaded (a
 * GPU). A file is used only when all of it agrees: magic, version, model
 * identity, the descriptor compared whole, its size, its hash and parent and
 * tokens, and its checksum. Files of another model, version or format are
 * left alone (one warning per kind at open); damaged ones (short, bad
 * checksum) are removed with a warning. Writes go to a temporary file that
 * is renamed into place, so a crash leaves no half-written block under a
 * block's name.
 *
 * Size: the files are kept under max_bytes by removing the least recently
 * used first (a file's use is its modification time, set when it is
 * written or read back); among equally recent ones the deepest go first,
 * so that a chain loses its tail before its head.
 *
 * Threads: a writer of its own. An evicted block is copied out of the pool
 * into a queue of block images on the thread that drives the pool (the
 * pool's hooks run there) and written to disk by the writer, so that thread
 * never waits on the disk. The queue is bounded (64 MiB of images, 2 to 64
 * of them); a block evicted while it is full is not written (counted as
 * dropped). A queued block is read back from its image, so it is found from
 * the moment it is evicted. kv_disk_flush (which waits for room instead of
 * dropping, then for the queue to empty) and kv_disk_close (which lets the
 * writer empty the queue, then stops it) must run on the pool's thread too
 * (or after it stopped); kv_disk_get_stats may run anywhere. */
#ifndef HEARTH_ENGINE_KV_DISK_H
#define HEARTH_ENGINE_KV_DISK_H

#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"
#include "engine/kv_paged.h"

#define KV_DISK_VERSION 1
#define KV_DISK_DEFAULT_MAX ((int64_t)4 << 30)

typedef struct kv_disk kv_disk;

/* Opens (creates) dir as the store of pool p's blocks for the model whose
 * identity is model_id, reads the headers of the blocks already there, and
 * sets the pool's hooks. max_bytes <= 0: KV_DISK_DEFAULT_MAX. */
int kv_disk_open(const char *dir, int64_t max_bytes, uint64_t model_id, kv_pool *p, kv_disk **out, herr *err);
/* Writes the published blocks of the pool that the store lacks: the most
 * recently used that fit max_bytes (those sequences hold count as the most
 * recent), oldest first. */
int kv_disk_flush(kv_disk *d, herr *err);
/* Waits until the writer has written every queued block (returns at once
 * while writes are held). */
void kv_disk_sync(kv_disk *d);
/* Holds the writer (true): queued blocks stay queued until released (false)
 * or the store closes. For tests of the queue. */
void kv_disk_hold(kv_disk *d, bool hold);
/* Removes the pool's hooks, lets the writer write what is queued, and frees
 * (no flush of the pool's other blocks). */
void kv_disk_close(kv_disk *d);

typedef struct kv_disk_stats {
  int64_t files, bytes;      /* blocks in the store now, and their bytes */
  int64_t saved, loaded;     /* blocks written, blocks read back into the pool (from a file or the queue) */
  int64_t removed;           /* files removed to stay under max_bytes */
  int64_t rejected;          /* files ignored or removed: another model, version or format, or damaged */
  int64_t hit_tokens;        /* prompt tokens the blocks read back saved computing (loaded × block tokens) */
  int64_t pending;           /* blocks queued for the writer now */
  int64_t dropped;           /* evicted blocks not written: the queue was full */
} kv_disk_stats;
void kv_disk_get_stats(kv_disk *d, kv_disk_stats *out);

/* One block file's contents, pointing into its bytes. */
typedef struct kv_disk_block {
  uint64_t hash, parent;
  int32_t depth;
  const unsigned char *tokens;  /* block_tokens little-endian int32 (read bytewise: not aligned) */
  const unsigned char *payload; /* kv_pool_block_payload bytes */
} kv_disk_block;

/* Checks the bytes of one block file against the store (magic, version,
 * model, format descriptor, sizes, checksum): 0 with the block in *out;
 * else HEARTH_EFORMAT saying why. What a read back runs before the block
 * reaches the pool. */
int kv_disk_parse_block(const kv_disk *d, const unsigned char *data, size_t size, kv_disk_block *out, herr *err);

/* A model's identity for the store: a 64-bit hash of config.json, and of
 * each weight file (*.safetensors of a folder, or the .gguf file) its size,
 * first 64 KiB (the tensor index) and 16 windows of 4 KiB spread over it;
 * and of `extra` (what else changes the KV: the device kind, weights
 * rounded to bf16). Renaming or copying the folder keeps it; retraining,
 * requantizing or editing the config changes it. */
int kv_disk_model_identity(const char *path, const char *extra, uint64_t *out, herr *err);

#endif
