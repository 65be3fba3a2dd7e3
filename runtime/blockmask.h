/* blockmask.h: block masks in PyTorch's BlockMask layout (docs/blockmask.md).
 *
 * For each (b, h) and query block i, kv_indices[b,h,i,:] lists the key
 * blocks to visit, ascending, in its first kv_num_blocks[b,h,i] entries;
 * the rest of the row is 0. With full_* present, kv_* lists the partial
 * blocks only (those that need the per-element mask) and full_kv_* the
 * blocks where the mask is true everywhere. The q_* side is the transpose
 * (for each key block, the query blocks that see it), for the backward.
 * B and H extents are 1 when the mask reads neither b nor h.
 *
 * Builders:
 *   RT_MASK_ANALYSIS  interval analysis only, O(1) per block; blocks it
 *                     cannot decide are listed as partial (always safe)
 *   RT_MASK_EVAL      the CPU twin of the device builder: the analysis,
 *                     then the interpreter element by element on the blocks
 *                     it left undecided (stopping at the first mixed pair)
 *   RT_MASK_BLOCKWISE every block element by element, no analysis
 *   RT_MASK_DENSE     a dense B*H*Q*KV evaluation first (tests only)
 * All but DENSE use memory proportional to the number of blocks.
 */
#ifndef FLEXC_BLOCKMASK_H
#define FLEXC_BLOCKMASK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "flex.h"
#include "ir/interval.h"

/* A block mask; every array is int32, C order, owned (base_alloc). */
typedef struct RtBlockMask {
  int B, H;                    /* batch and head extents (1: broadcast) */
  int q_len, kv_len;           /* sequence lengths it was built for */
  int block_q, block_kv;       /* block sizes */
  int nq, nkv;                 /* block counts: ceil(len / block) */
  bool has_full;               /* full_* present: kv_* / q_* then list partial blocks only */
  int32_t *kv_num_blocks;      /* [B, H, nq] */
  int32_t *kv_indices;         /* [B, H, nq, nkv] */
  int32_t *full_kv_num_blocks; /* [B, H, nq] (NULL without has_full) */
  int32_t *full_kv_indices;    /* [B, H, nq, nkv] (NULL without has_full) */
  int32_t *q_num_blocks;       /* [B, H, nkv] */
  int32_t *q_indices;          /* [B, H, nkv, nq] */
  int32_t *full_q_num_blocks;  /* [B, H, nkv] (NULL without has_full) */
  int32_t *full_q_indices;     /* [B, H, nkv, nq] (NULL without has_full) */
} RtBlockMask;

/* Which builder (see the top of this file). */
typedef enum RtMaskMode { RT_MASK_ANALYSIS, RT_MASK_EVAL, RT_MASK_BLOCKWISE, RT_MASK_DENSE } RtMaskMode;

/* The problem a mask is built for. */
typedef struct RtMaskShape {
  int B, H, q_len, kv_len; /* attention sizes (all >= 1) */
  int block_q, block_kv;   /* block sizes (0: 128) */
  int q_off, kv_off;       /* a shard's position offsets: the mask sees q + q_off, kv + kv_off */
} RtMaskShape;

/* What a build found. */
typedef struct RtMaskStats {
  int64_t total;        /* blocks: B' * H' * nq * nkv (B', H' the stored extents) */
  int64_t full, partial, empty;
  int64_t undecided;    /* blocks the analysis left open (ANALYSIS / EVAL) */
  int64_t refined;      /* of those, blocks evaluation found full or empty */
  int64_t evaluated;    /* mask evaluations done element by element */
  bool decidable;       /* ir_interval_decidable(): kernels could classify blocks themselves */
} RtMaskStats;

/* Build the block mask of m->mask (all blocks full when m has no mask).
 * env binds params, sizes and buffers (host data) as for ir_eval. Returns
 * FLEX_OK, or FLEX_ERR_INVALID with the message set (rt_err) (an out-of-range
 * buffer read, say). stats may be NULL. */
flex_status rt_block_mask_build(RtBlockMask *out, const IrModule *m, const IrIntervalEnv *env,
                                const RtMaskShape *shape, RtMaskMode mode, RtMaskStats *stats);

/* How RT_MASK_EVAL and RT_MASK_BLOCKWISE evaluate open blocks: rows of
 * blocks on the thread pool (threads 0; 1: the calling thread), and the
 * row-vectorised interpreter (`vector`) or the plain one, element by
 * element (threads 1, vector false: the builder as it was, for benchmarks
 * and tests). Process-wide. */
void rt_block_mask_eval_config(int threads, bool vector);

/* ---- the one host block classifier ---------------------------------------------- */

/* The blocks of a classification: stored (b, h) extents and the blocks of
 * one (b, h). A stored extent of 1 where the call's is larger means the
 * mask does not read that argument: b = 0 (h = 0) stands for every value. */
typedef struct RtBlockGrid {
  int B, H;              /* stored extents */
  int q_len, kv_len;     /* rows and keys */
  int block_q, block_kv; /* block sizes */
  int nq, nkv;           /* blocks: ceil(len / block) */
  int b_base;            /* the mask sees batch b + b_base (a packed call's sequence) */
  int q_base, kv_base;   /* and rows q + q_base, keys kv + kv_base (a shard's positions) */
} RtBlockGrid;

/* One block: stored batch and head, rows q0..q1 and keys k0..k1
 * (inclusive), in the grid's own coordinates (without its bases). */
typedef struct RtRect {
  int b, h, q0, q1, k0, k1;
} RtRect;

/* Element-wise classification of the blocks the analysis leaves open: the
 * interpreter (the builder here), the cpu backend's JIT-compiled mask. */
typedef struct RtBlockEval {
  /* The class of r from its elements (FLEX_BLOCK_*), on pool worker
   * `worker` (below base_pool_size()); -1 when an evaluation failed, with
   * the message in err. */
  int (*block)(void *ctx, int worker, const RtRect *r, char *err, size_t cap);
  void *ctx;
  bool pooled;           /* block may run on the pool's workers */
} RtBlockEval;

/* Every block of g into cls[B][H][nq][nkv] (FLEX_BLOCK_* bytes): the
 * interval analysis when `analysis`, then ev on the blocks still open (ev
 * NULL: they stay partial, always safe). Rows of blocks run on the pool.
 * FLEX_ERR_INVALID with the lowest failed row's message when an element
 * evaluation fails. st (may be NULL) gets undecided and refined added. */
flex_status rt_classify_blocks(const RtBlockGrid *g, const IrModule *m, const IrIntervalEnv *ienv,
                               bool analysis, const RtBlockEval *ev, uint8_t *cls, RtMaskStats *st);

/* Validate a caller's BlockMask (int32, host memory, shapes, indices in
 * range, no duplicates, full and partial disjoint, q side consistent with
 * the kv side when given) for the attention sizes in shape (block sizes
 * come from u), and copy it into out in normal form (ascending, zero
 * filled, q side derived when absent). */
flex_status rt_block_mask_from_user(RtBlockMask *out, const flex_block_mask *u,
                                    const RtMaskShape *shape);

/* Whether two block masks are identical (extents and all eight arrays). */
bool rt_block_mask_equal(const RtBlockMask *a, const RtBlockMask *b);
void rt_block_mask_free(RtBlockMask *bm);

#endif
