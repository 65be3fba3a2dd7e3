/* blocklist.cuh: block classes into PyTorch-layout block lists, the one
 * list step of every BlockMask builder. Written once for two compilers:
 * the builder kernel (kernels/flex_blockmask.cuh, CUDA and the emulator)
 * and the host (runtime/blockmask.c, C11: its builder, a caller's mask in
 * normal form, and the cpu backend's builder entry).
 *
 * One row of classes (a query block's key blocks, the kv side) or one
 * column (a key block's query blocks, the q side, `step` bytes apart)
 * becomes two lists: partial blocks' indices ascending in idx, full ones'
 * in full_idx, each row's unused tail zeroed, and the two counts. Without
 * full lists (full_idx NULL) full blocks join the partial ones (their
 * elements are then masked too, which is harmless).
 */
#ifndef FLEX_BLOCKLIST_CUH
#define FLEX_BLOCKLIST_CUH

#include "interval.cuh" /* FlexBlockClass */

#if defined(__CUDACC__) || defined(__CUDACC_RTC__) || defined(FLEXC_EMU)
#define FLEX_BL_FN __device__ __forceinline__
#define FLEX_BL_LOAD(p) flex_gload(p)
#define FLEX_BL_STORE(p, v) flex_gstore(p, v)
#else
#define FLEX_BL_FN static inline
#define FLEX_BL_LOAD(p) (*(p))
#define FLEX_BL_STORE(p, v) (*(p) = (v))
#endif

FLEX_BL_FN void flex_block_side(const unsigned char *cls, int64_t step, int n, int32_t *num,
                                int32_t *idx, int32_t *full_num, int32_t *full_idx) {
  int np = 0, nf = 0;
  for (int x = 0; x < n; x++) {
    const int c = FLEX_BL_LOAD(cls + x * step);
    if (c == FLEX_BLOCK_FULL && full_idx) FLEX_BL_STORE(full_idx + nf++, (int32_t)x);
    else if (c != FLEX_BLOCK_EMPTY) FLEX_BL_STORE(idx + np++, (int32_t)x);
  }
  for (int x = np; x < n; x++) FLEX_BL_STORE(idx + x, (int32_t)0);
  FLEX_BL_STORE(num, (int32_t)np);
  if (!full_idx) return;
  for (int x = nf; x < n; x++) FLEX_BL_STORE(full_idx + x, (int32_t)0);
  FLEX_BL_STORE(full_num, (int32_t)nf);
}

/* Both sides of every (b, h) of classes cls[bh][nq][nkv]: out[0..3] the kv
 * side (num [bh][nq], idx [bh][nq][nkv], full_num, full_idx), out[4..7]
 * the q side ([bh][nkv], [bh][nkv][nq]); t picks one row or column of one
 * (b, h): t < nq a kv-side row, else column t - nq. */
FLEX_BL_FN void flex_block_lists_at(const unsigned char *cls, int64_t bh, int nq, int nkv, int t,
                                    int32_t *const out[8]) {
  const unsigned char *c = cls + bh * nq * nkv;
  if (t < nq) {
    const int64_t r = bh * nq + t;
    flex_block_side(c + (int64_t)t * nkv, 1, nkv, out[0] + r, out[1] + r * nkv,
                    out[2] ? out[2] + r : 0, out[3] ? out[3] + r * nkv : 0);
  } else if (t < nq + nkv) {
    const int j = t - nq;
    const int64_t r = bh * nkv + j;
    flex_block_side(c + j, nkv, nq, out[4] + r, out[5] + r * nq, out[6] ? out[6] + r : 0,
                    out[7] ? out[7] + r * nq : 0);
  }
}

#endif /* FLEX_BLOCKLIST_CUH */
