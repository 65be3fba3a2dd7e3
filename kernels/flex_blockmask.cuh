/* flex_blockmask.cuh: the BlockMask builder, for masks the interval
 * analysis cannot decide (a buffer that is not `sorted`, say).
 *
 * flex_mask_build_body: one CTA per (query block, head, batch) of the
 *   mask's stored extents; its threads take the key blocks in turn. A block
 *   is first classified with flex_mask_block (interval analysis, O(1));
 *   only a PARTIAL answer is checked element by element with flex_mask,
 *   stopping at the first element that disagrees with the first one. One
 *   class byte per block goes to p.mask_cls.
 * flex_mask_lists_body: one thread per query-block row (kv side) or
 *   key-block column (q side) turns the class bytes into PyTorch-layout
 *   lists: full and partial block indices ascending, the rest of the row
 *   0, and the counts.
 * Memory is one byte per block plus the lists: never a dense B*H*Q*KV
 * tensor. The emulator runs the same code on the CPU (RT_MASK_EVAL in
 * runtime/blockmask.c is the interpreter's twin of it).
 */
#ifndef FLEX_BLOCKMASK_CUH
#define FLEX_BLOCKMASK_CUH

#include "common.cuh"
#include "interval.cuh"

/* The class of one block: the analysis, then elements where it is unsure. */
__device__ __forceinline__ int flex_mask_block_eval(const FlexParams &p, int b, int h, int q0, int q1,
                                                    int k0, int k1) {
  const int k = flex_mask_block(p, b, b, h, h, q0, q1, k0, k1);
  if (k != FLEX_BLOCK_PARTIAL) return k;
  const bool first = flex_mask(p, b, h, q0, k0);
  for (int q = q0; q <= q1; q++)
    for (int kv = k0; kv <= k1; kv++)
      if (flex_mask(p, b, h, q, kv) != first) return FLEX_BLOCK_PARTIAL;
  return first ? FLEX_BLOCK_FULL : FLEX_BLOCK_EMPTY;
}

__device__ __forceinline__ void flex_mask_build_body(const FlexParams &p) {
  const int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int q0 = i * p.block_q, q1 = min(q0 + p.block_q, p.q_len) - 1;
  unsigned char *row = p.mask_cls + (((int64_t)b * p.mask_H + h) * p.mask_nq + i) * p.mask_nkv;
  for (int j = threadIdx.x; j < p.mask_nkv; j += blockDim.x) {
    const int k0 = j * p.block_kv, k1 = min(k0 + p.block_kv, p.kv_len) - 1;
    flex_gstore(row + j, (unsigned char)flex_mask_block_eval(p, b, h, q0, q1, k0, k1));
  }
}

/* One row (or column) of classes, `step` bytes apart, into the two lists. */
__device__ __forceinline__ void flex_mask_side(const unsigned char *cls, int64_t step, int n,
                                               int32_t *num, int32_t *idx, int32_t *full_num,
                                               int32_t *full_idx) {
  int np = 0, nf = 0;
  for (int x = 0; x < n; x++) {
    const int c = flex_gload(cls + x * step);
    if (c == FLEX_BLOCK_FULL) flex_gstore(full_idx + nf++, (int32_t)x);
    else if (c == FLEX_BLOCK_PARTIAL) flex_gstore(idx + np++, (int32_t)x);
  }
  for (int x = np; x < n; x++) flex_gstore(idx + x, (int32_t)0);
  for (int x = nf; x < n; x++) flex_gstore(full_idx + x, (int32_t)0);
  flex_gstore(num, (int32_t)np);
  flex_gstore(full_num, (int32_t)nf);
}

__device__ __forceinline__ void flex_mask_lists_body(const FlexParams &p) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int nq = p.mask_nq, nkv = p.mask_nkv;
  const int64_t bh = (int64_t)b * p.mask_H + h;
  const unsigned char *cls = p.mask_cls + bh * nq * nkv;
  if (t < nq) {
    const int64_t r = bh * nq + t;
    flex_mask_side(cls + (int64_t)t * nkv, 1, nkv, p.mask_out[0] + r, p.mask_out[1] + r * nkv,
                   p.mask_out[2] + r, p.mask_out[3] + r * nkv);
  } else if (t < nq + nkv) {
    const int j = t - nq;
    const int64_t r = bh * nkv + j;
    flex_mask_side(cls + j, nkv, nq, p.mask_out[4] + r, p.mask_out[5] + r * nq,
                   p.mask_out[6] + r, p.mask_out[7] + r * nq);
  }
}

#endif /* FLEX_BLOCKMASK_CUH */
