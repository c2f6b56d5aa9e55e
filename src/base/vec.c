/* vec.c — growing malloc'd arrays (see vec.h). */
#include "base/vec.h"

#include <stdint.h>
#include <stdlib.h>

bool hgrow(void **p, size_t *cap, size_t want, size_t elem) {
  if (want <= *cap) return true;
  size_t n = *cap ? *cap : HGROW_MIN;
  while (n < want) n = n > SIZE_MAX / 2 ? want : n * 2;
  if (elem && n > SIZE_MAX / elem) return false;
  void *q = realloc(*p, elem ? n * elem : 1);
  if (!q) return false;
  *p = q;
  *cap = n;
  return true;
}
