/* hash.h — the one 64-bit mixer: the splitmix64 finalizer (Steele, Lea and
 * Flood; the constants of Vigna's splitmix64.c). A bijection on uint64_t with
 * full avalanche, used for hash-table slots, prefix-cache block hashes,
 * response ids and RNG seeding. Values derived from it are persistent where
 * callers make them so (prefix hashes, the sampler's seeded sequence): the
 * constants must not change. */
#ifndef HEARTH_BASE_HASH_H
#define HEARTH_BASE_HASH_H

#include <stdint.h>

/* The golden-ratio increment of splitmix64's state. */
#define HMIX64_GAMMA 0x9E3779B97F4A7C15ull

/* The splitmix64 finalizer of x. */
static inline uint64_t hmix64(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/* One step of splitmix64: advances *state by the gamma and returns the mix of it. */
static inline uint64_t hsplitmix64(uint64_t *state) {
  *state += HMIX64_GAMMA;
  return hmix64(*state);
}

#endif
