/* flex_sorted.cuh: the `sorted` promise of one 1-D integer buffer, checked
 * where the buffer lives (docs/language.md: one O(length) pass per buffer, before any
 * block is skipped).
 *
 * flex_sorted_check_body: a grid-stride loop over i in [1, n) of
 *   p.buf[p.sorted_slot]. A thread that finds buf[i] < buf[i-1] records
 *   n - i with an atomic max and stops (its later indices are larger), so
 *   the record ends as n - i of the first decrease, the index the host
 *   check (rt_check_sorted) reports. A record of 0 (memory of the run
 *   sequence's is zero-filled) means the buffer never decreases; max over
 *   n - i rather than min over i spares the upload of a starting value.
 * u8 elements compare unsigned, i32 and i64 signed, as the host check does.
 */
#ifndef FLEX_SORTED_CUH
#define FLEX_SORTED_CUH

#include "common.cuh"

template <class T>
__device__ __forceinline__ void flex_sorted_scan(const T *x, int64_t n, uint64_t *rec) {
  const int64_t step = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = 1 + (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step)
    if (flex_gload(x + i) < flex_gload(x + i - 1)) {
      flex_atomic_max_u64(rec, (uint64_t)(n - i));
      return;
    }
}

__device__ __forceinline__ void flex_sorted_check_body(const FlexParams &p) {
  const void *x = p.buf[p.sorted_slot];
  if (p.sorted_bytes == 8) flex_sorted_scan((const int64_t *)x, p.sorted_len, p.sorted_rec);
  else if (p.sorted_bytes == 4) flex_sorted_scan((const int32_t *)x, p.sorted_len, p.sorted_rec);
  else flex_sorted_scan((const unsigned char *)x, p.sorted_len, p.sorted_rec);
}

#endif /* FLEX_SORTED_CUH */
