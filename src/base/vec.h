/* vec.h — growing malloc'd arrays. hgrow makes room for at least `want`
 * elements of `elem` bytes in *p (of *cap elements): the capacity doubles,
 * starting from HGROW_MIN, until it holds want, so that n appends cost O(n).
 * A size that would overflow is refused; on failure (overflow or out of
 * memory) *p and *cap are untouched and the caller's array is still valid.
 * The capacity depends only on *cap and want, never on elem, so parallel
 * arrays grown from one capacity stay the same length.
 *
 * HGROW(arr, cap, want) is the typed form for a pointer variable `arr` of any
 * element type and a capacity `cap` of any integer type (updated only when
 * the new capacity fits it):
 *   if (v->n == v->cap && !HGROW(v->items, v->cap, v->n + 1)) return oom(); */
#ifndef HEARTH_BASE_VEC_H
#define HEARTH_BASE_VEC_H

#include <stdbool.h>
#include <stddef.h>

#define HGROW_MIN 4

bool hgrow(void **p, size_t *cap, size_t want, size_t elem);

#define HGROW(arr, cap, want)                                                         \
  __extension__({                                                                     \
    void *hgrow_p_ = (arr);                                                           \
    size_t hgrow_c_ = (size_t)(cap);                                                  \
    bool hgrow_ok_ = hgrow(&hgrow_p_, &hgrow_c_, (size_t)(want), sizeof *(arr));     \
    (arr) = hgrow_p_;                                                                 \
    if (hgrow_ok_ && (size_t)(__typeof__(cap))hgrow_c_ != hgrow_c_) hgrow_ok_ = false; \
    if (hgrow_ok_) (cap) = (__typeof__(cap))hgrow_c_;                                 \
    hgrow_ok_;                                                                        \
  })

#endif
