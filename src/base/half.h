/* half.h — the one IEEE half-precision and bfloat16 decoder, inline so the
 * hot loops that widen weights (backend kernels, dequantizers) and the
 * loaders (safetensors) share it: exact for every value, subnormals, signed
 * zero, infinities and NaN payloads included. */
#ifndef HEARTH_BASE_HALF_H
#define HEARTH_BASE_HALF_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float hf16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
  if (exp == 0) {
    float f = ldexpf((float)man, -24); /* zero or subnormal: man × 2^-24 */
    return sign ? -f : f;
  }
  if (exp == 31) bits = sign | 0x7F800000u | (man << 13); /* inf / nan */
  else bits = sign | ((exp + 112) << 23) | (man << 13);
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

static inline float hbf16_to_f32(uint16_t b) {
  uint32_t bits = (uint32_t)b << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

#endif
