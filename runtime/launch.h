/* launch.h: what the emulator and the CUDA backend both do before a launch,
 * written once: FlexParams from a validated call, the 16-byte load
 * decision, and the mask plan (no mask, implicit classification, a
 * caller's BlockMask, or a BlockMask built by the builder kernels).
 *
 *   rt_launch_fill         FlexParams from the call (tensors used in place)
 *   rt_launch_mask_plan    pick the mask mode; validate a caller's BlockMask
 *   rt_launch_set_lists    point the four walk lists at contiguous arrays
 *   rt_launch_builder      the builder's fields of FlexParams
 */
#ifndef FLEXC_LAUNCH_H
#define FLEXC_LAUNCH_H

#include <stdint.h>

#include "codegen/codegen.h"
#include "kernels/params.cuh"
#include "runtime/blockmask.h"
#include "runtime/rt.h"
#include "runtime/tensor.h"

/* [B, heads, rows, cols] strides (zeros for a NULL tensor). */
FlexStrides rt_strides4(const DLTensor *t);

/* FlexParams from the call: every tensor in place (out/dq/dk/dv too: a
 * backend that stages them overwrites those fields), params, sizes,
 * buffers, and vec16 when its conditions hold (docs/kernels.md). The block
 * lists are left empty (see the mask plan). */
flex_status rt_launch_fill(const RtCall *c, FlexParams *p, const char *backend);

/* Whether TMA can load the call's q, k and v (and dout for a backward: the
 * sm_90a kernels): 16-bit, E and EV multiples of 8, 16-byte aligned bases
 * and strides. */
bool rt_launch_tma_ok(const RtCall *c);

/* A tensor-map encoder (the driver's cuTensorMapEncodeTiled, or the
 * emulator's stand-in): a 16-bit tensor of `rank` dims (innermost first),
 * byte strides of dims 1.., box, 128-byte swizzle, into the 128 bytes at
 * `map`. NULL on success, else what is wrong. */
typedef const char *(*RtTmapEncode)(void *ctx, FlexTmapBytes *map, const void *base,
                                    const uint64_t dims[4], const uint64_t strides[3],
                                    const uint32_t box[4]);

/* The sm_90a forward's parameter (o->fwd_sm90): p and the maps of q, k, v
 * as {E, rows, heads, B} with boxes of 64 columns x the tile's rows.
 * FLEX_ERR_UNSUPPORTED naming the tensor when the encoder refuses it. */
flex_status rt_launch_fwd_tma(const CgOptions *o, const FlexParams *p, RtTmapEncode enc, void *ctx,
                              FlexFwdTma *out);
/* The sm_90a backward's parameter (o->bwd_sm90): p and the maps of q, dout
 * (boxes of bwd.block_m rows), k and v (bwd.block_n rows), as above. */
flex_status rt_launch_bwd_tma(const CgOptions *o, const FlexParams *p, RtTmapEncode enc, void *ctx,
                              FlexBwdTma *out);

/* How one call handles its mask. */
typedef struct RtMaskPlan {
  CgMaskMode mode;      /* what the kernels are generated with */
  bool build;           /* run flex_mask_build + flex_mask_lists first */
  bool user;            /* a caller's BlockMask, normalised into `bm` */
  RtBlockMask bm;       /* the caller's mask in normal form (host memory) */
  int Bm, Hm;           /* the built mask's stored extents (1: broadcast) */
  int block_q, block_kv; /* the built mask's block sizes */
  int nq, nkv;          /* its block counts */
} RtMaskPlan;

/* The arrays of the mask mode cg_plan chose (o->mask_mode, mask_builder):
 * a caller's BlockMask validated and normalised (rt_block_mask_from_user,
 * from host copies; its blocks must be multiples of the kernels' tiles), or
 * the builder's extents and block sizes. Free with rt_launch_mask_free. */
flex_status rt_launch_mask_plan(const RtCall *c, const CgOptions *o, RtMaskPlan *plan);
void rt_launch_mask_free(RtMaskPlan *plan);

/* Bytes of the builder's arrays: [0..7] as FlexParams.mask_out, [8] the class bytes. */
void rt_launch_mask_bytes(const RtMaskPlan *plan, size_t bytes[9]);

/* Point p's walk lists at eight contiguous int32 arrays laid out as
 * RtBlockMask's ([B', H', rows], [B', H', rows, cols]; B', H' = Bm, Hm,
 * broadcast when 1); full arrays may be NULL. Sets block_q / block_kv. */
void rt_launch_set_lists(FlexParams *p, int32_t *const arr[8], int Bm, int Hm, int nq, int nkv,
                         int block_q, int block_kv);

/* The builder's fields: class bytes and the eight output arrays (each
 * sized by rt_launch_mask_bytes), which also become the walk lists. */
void rt_launch_builder(FlexParams *p, const RtMaskPlan *plan, unsigned char *cls,
                       int32_t *const arr[8]);

/* The mask's lists of a plan with a caller's BlockMask. */
void rt_launch_user_lists(FlexParams *p, const RtMaskPlan *plan);

/* The hardware's launch limits (every CUDA device of compute capability
 * 8.0 on): gridDim.x < 2^31, gridDim.y and .z <= 65535, at most 1024
 * threads per block. FLEX_ERR_UNSUPPORTED naming the entry and what is too
 * large (the kernels put heads in y and batches in z). */
#define RT_GRID_X_MAX 2147483647u
#define RT_GRID_YZ_MAX 65535u
flex_status rt_launch_check_geometry(const char *backend, const char *entry, const unsigned grid[3],
                                     const unsigned block[3]);

/* A checked run's record (FLEX_BOUNDS_WORDS, read back after the
 * launches): FLEX_OK, or FLEX_ERR_RUNTIME with the failed access in the
 * interpreter's words (buffer, index values, shape, FILE:LINE:COL). */
flex_status rt_launch_bounds_report(const RtCall *c, const int32_t *rec);

#endif
