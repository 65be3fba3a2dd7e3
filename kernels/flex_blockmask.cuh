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
 *   lists (kernels/blocklist.cuh, the host's list step too).
 * Memory is one byte per block plus the lists: never a dense B*H*Q*KV
 * tensor. The emulator runs the same code on the CPU (RT_MASK_EVAL in
 * runtime/blockmask.c is the interpreter's twin of it).
 */
#ifndef FLEX_BLOCKMASK_CUH
#define FLEX_BLOCKMASK_CUH

#include "common.cuh"
#include "interval.cuh"
#include "blocklist.cuh"

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

/* One thread per row and column of one (b, h): blocklist.cuh's list step. */
__device__ __forceinline__ void flex_mask_lists_body(const FlexParams &p) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x, h = blockIdx.y, b = blockIdx.z;
  flex_block_lists_at(p.mask_cls, (int64_t)b * p.mask_H + h, p.mask_nq, p.mask_nkv, t, p.mask_out);
}

#endif /* FLEX_BLOCKMASK_CUH */
