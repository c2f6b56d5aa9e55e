/* mm_positions.c — the three-axis positions of a prompt with media runs (see mm_positions.h). */
#include "model/mm_positions.h"

int64_t mm_positions3(const bool *soft, const int32_t *pos3, int64_t n, int32_t *out) {
  int64_t next = 0, k = 0;
  for (int64_t i = 0; i < n;) {
    if (!soft[i]) {
      out[3 * i] = out[3 * i + 1] = out[3 * i + 2] = (int32_t)next;
      next++, i++;
      continue;
    }
    int64_t start = next, top = 0;
    for (; i < n && soft[i]; i++, k++)
      for (int a = 0; a < 3; a++) {
        out[3 * i + a] = (int32_t)(start + pos3[3 * k + a]);
        if (pos3[3 * k + a] > top) top = pos3[3 * k + a];
      }
    next = start + top + 1;
  }
  return next;
}
