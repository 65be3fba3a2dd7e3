/* codegen.h: IR + kernel templates -> one CUDA translation unit.
 *
 *   emit.c    CgOut: a small indenting text emitter
 *   func.c    cg_emit_funcs(): score, mask and joint as __device__ functions
 *   kernel.c  cg_options_init(), cg_emit_cuda(): tiles, template
 *             instantiation, the extern "C" entries; cg_launch_*(): grid,
 *             block and dynamic shared memory of each entry
 *   plan.c    cg_plan(): every kernel choice of one call, from its shape
 *             and the device's capabilities
 *
 * The generated source includes the embedded templates by name
 * (kernels/NAME.cuh); every entry takes one FlexParams (kernels/params.cuh).
 */
#ifndef FLEXC_CODEGEN_H
#define FLEXC_CODEGEN_H

#include <stdbool.h>
#include <stddef.h>

#include "base/base.h"
#include "ir/ir.h"

/* Element type of q, k, v and the outputs. */
typedef enum CgDtype { CG_FP32, CG_FP16, CG_BF16 } CgDtype;
/* Target architecture. */
typedef enum CgArch { CG_SM80, CG_SM86, CG_SM89, CG_SM90, CG_SM90A, CG_NARCH } CgArch;
/* How the kernels decide which tiles to visit and where to evaluate the mask. */
typedef enum CgMaskMode {
  CG_MASK_NONE = 0,  /* no mask: every tile, no per-element test */
  CG_MASK_LISTS = 1, /* BlockMask lists; per-element mask on partial blocks */
  CG_MASK_DENSE = 2, /* every tile, per-element mask everywhere */
  CG_MASK_IMPLICIT = 3, /* the walk classifies tiles itself (flex_mask_block); no BlockMask */
} CgMaskMode;

/* Tile shape of one kernel body. */
typedef struct CgTiles {
  int block_m;  /* query rows per tile */
  int block_n;  /* keys per tile */
  int threads;  /* threads per CTA */
} CgTiles;

/* What to generate. cg_options_init() fills every field from the module. */
typedef struct CgOptions {
  CgDtype dtype;       /* element type */
  int head_dim;        /* E, 1..256 */
  int head_dim_v;      /* EV, 1..256 */
  int head_dim_pad;    /* E padded for the kernel body (multiple of 16 or of the fp32 row split) */
  int head_dim_v_pad;  /* EV padded likewise */
  CgArch arch;         /* target */
  CgMaskMode mask_mode; /* block walk and mask evaluation */
  bool has_mask;       /* the kernel has a mask function */
  bool has_sink;       /* the kernel has a sink function: FLEX_SINK defined (flex_sink, flex_sink_grad) */
  bool mask_builder;   /* also emit the BlockMask builder entries (kernels/flex_blockmask.cuh) */
  bool sorted_check;   /* some buffer is `sorted`: also emit flex_sorted_check (kernels/flex_sorted.cuh) */
  bool backward;       /* emit the backward entries (needs m->joint) */
  bool grad_buffers;   /* some buffer is `grad`: the joint has ACCUMs */
  bool score_identity; /* the score returns s unchanged: skip the call */
  int mask_divisions;  /* integer divisions and remainders of an implicit mask (sm_90a: consumers) */
  bool ds_is_dt;       /* d score/d s == 1 and no ACCUMs: skip the joint call */
  bool check_bounds;   /* checked run: buffer accesses tested, first failure recorded in p.bounds */
  bool fast_math;      /* opt-in: hardware approximations for exp, log, tanh, sigmoid, sin, cos, pow */
  bool watchdog;       /* FLEX_WATCHDOG defined: an mbarrier wait of 2^33 cycles prints and traps */
  bool paged;          /* forward reads K/V through a page table (FlexParams.pages); false: the
                          kernels are exactly the unpaged ones */
  bool out_f32;        /* O is fp32 whatever the input dtype: flex_fwd writes it, flex_bwd_pre reads it */
  bool dropout;        /* dropout on (p > 0): FLEX_DROPOUT defined, the kernels draw Philox bits */
  bool offsets;        /* position offsets (a shard): FLEX_OFFSETS defined, the functions, their
                          classifier and dropout see q + p.q_off, kv + p.kv_off */
  bool dqk;            /* float(kv - q) in score and joint is the kernels' flex_dqk argument
                          (a per-row base converted once, plus a constant): exact while every
                          position is below 2^24 - 1024, which cg_plan checks; not with
                          offsets or grouped-query packing (their q and kv are remapped) */
  bool score_bias;     /* the score is s + G, G = a float(kv - q) + c with a and c free of q
                          and kv (cg_score_bias) */
  bool bias_fold;      /* cg_plan: the call's scale lets the tensor-core kernels fold G into S's
                          accumulators (|scale| >= 2^-16); see cg_bias_folded */
  bool kv_split;       /* a split-KV forward (FlexParams.kv_splits > 1): FLEX_KV_SPLIT defined,
                          flex_fwd writes partials per key chunk (docs/decoding.md) */
  bool pack_gqa;       /* forward only: grouped-query packing, the rows of a kernel head are the
                          G query heads of a kv head (FlexParams.pack_g, pack_q_len; wrappers map
                          them back for the user's functions; docs/decoding.md) */
  bool deterministic;  /* a deterministic backward: FLEX_DETERMINISTIC defined, dQ summed per CTA
                          slice in a fixed order, buffer gradients exact (docs/kernels.md) */
  bool no_tma;         /* the call's q, k, v cannot be TMA-loaded (rows or bases not 16-byte
                          aligned) or the backend builds no tensor maps: no sm_90a forward */
  bool fwd_sm90;       /* set by the tile choice: flex_fwd is the sm_90a body (wgmma + TMA,
                          kernels/flex_fwd_sm90.cuh) taking a FlexFwdTma; see cg_fwd_sm90_ok */
  bool bwd_sm90;       /* set by the tile choice: flex_bwd is the sm_90a body (wgmma + TMA,
                          kernels/flex_bwd_sm90.cuh) taking a FlexBwdTma; see cg_bwd_sm90_ok */
  CgTiles fwd;         /* forward tiles */
  CgTiles bwd;         /* backward main tiles */
  const char *source;  /* the .score file's name, for the header comment */
} CgOptions;

/* Whether m's params, buffers and size symbols fit FlexParams' slots; if
 * not, false with a message in err. */
bool cg_module_fits(const IrModule *m, char *err, size_t errlen);
/* Fill `o` for module `m` (joint used when non-NULL and `backward`). Returns
 * false with a message in `err` (size errlen) for unsupported options. */
bool cg_options_init(CgOptions *o, const IrModule *m, CgDtype dtype, int E, int EV, CgArch arch,
                     bool backward, char *err, size_t errlen);
/* Whether the forward of `o` can be the sm_90a body: sm_90a, fp16/bf16, K/V
 * not paged, no dropout, TMA-loadable tensors (!no_tma). */
bool cg_fwd_sm90_ok(const CgOptions *o);
bool cg_fwd_sm90_overlap(const CgOptions *o);
/* Whether the backward of `o` can be the sm_90a body: sm_90a, fp16/bf16,
 * head dims up to 256, no dropout, K/V not paged, not
 * deterministic, TMA-loadable tensors (!no_tma). Every other backward runs
 * flex_bwd_tc / flex_bwd_main (docs/kernels.md). */
bool cg_bwd_sm90_ok(const CgOptions *o);
/* The sm_90a forward's head dims padded to whole 64-column TMA panels. */
int cg_fwd_sm90_dim(int head_dim);
/* The sm_90a backward's consumer warpgroups (1, or 2 above head dim 128)
 * and its padded head dim (whole 64-column panels per consumer). */
int cg_bwd_sm90_consumers(const CgOptions *o);
int cg_bwd_sm90_dim(const CgOptions *o, int head_dim);

/* Pick the tiles again after a field that decides them changed (dropout,
 * paged, no_tma, and those cg_bias_folded reads: a folded bias takes an
 * identity score's tiles), FLEXC_TILES applied as cg_options_init does. */
bool cg_options_retile(CgOptions *o, char *err, size_t errlen);

/* One row of the tile table (codegen/kernel.c): the first row that matches
 * (arch in [lo, hi], dtype, padded head dim up to max_dim, and for `plain`
 * rows an identity score, no dropout and an implicit mask of at most two
 * integer divisions) gives the
 * forward and backward shapes. The forward's head dim is EV (its O
 * accumulators; fp32: the larger of E and EV), the backward's the larger
 * of E and EV (its dK/dV accumulators). */
typedef struct CgTileRow {
  CgArch lo, hi;     /* architectures */
  int dtype;         /* CgDtype, or -1 for fp16 and bf16 */
  int max_dim;       /* padded head dim at most this */
  bool plain;        /* only plain kernels (identity score...: fewer live registers) */
  CgTiles fwd, bwd;  /* block_m x block_n, threads */
} CgTileRow;

/* The tile table and its length (every row is run on the emulator by
 * check_emu_kernels --tiles). */
const CgTileRow *cg_tile_table(int *n);

/* Override the tiles of `o` (after cg_options_init) with `spec`:
 * "fwd=MxNxW,bwd=MxNxW" (either part may be left out), block_m x block_n
 * with W warps. False with a message in err when the spec is malformed or a
 * shape cannot instantiate its kernel; `o` is then unchanged.
 * cg_options_init applies $FLEXC_TILES this way. */
bool cg_tiles_apply(CgOptions *o, const char *spec, char *err, size_t errlen);

/* A binary32 value (v rounded to float) as the shortest CUDA literal that
 * reads back to the same float: `0.1f`, `(-2.5f)`, `INFINITY`, NaN as
 * `(0.0f / 0.0f)`. */
void cg_float_literal(Buf *out, double v);

/* Write the whole translation unit for `m` into `out`. */
void cg_emit_cuda(Buf *out, const IrModule *m, const CgOptions *o);
/* Whether the module's score is s + G with G = a float(kv - q) + c, a and c
 * free of s, q and kv, and (with `backward`) its joint does not read s
 * (CgOptions.score_bias). */
bool cg_score_bias(const IrModule *m, bool backward);
/* Whether the tensor-core kernels of `o` start S's accumulators at the
 * bias over the scale (FLEX_BIAS, flex_bias; docs/kernels.md): a bias
 * score, |scale| >= 2^-16 (bias_fold), fp16/bf16, flex_dqk on, no
 * offsets, packing or checked run. */
bool cg_bias_folded(const CgOptions *o);
/* Emit score, mask (and joint) as __device__ functions (part of cg_emit_cuda). */
void cg_emit_funcs(Buf *out, const IrModule *m, const CgOptions *o);

/* Launch geometry of one entry. */
typedef struct CgLaunch {
  unsigned grid[3];  /* blocks in x, y, z */
  unsigned block[3]; /* threads in x, y, z */
  size_t smem;       /* dynamic shared memory bytes (over 48 KB needs the opt-in attribute) */
} CgLaunch;

CgLaunch cg_launch_fwd(const CgOptions *o, int B, int H, int q_len);      /* flex_fwd */
/* flex_fwd split into `splits` key chunks (docs/decoding.md): the grid's x
 * is splits x the query tiles (split-major); splits <= 1 is cg_launch_fwd. */
CgLaunch cg_launch_fwd_split(const CgOptions *o, int B, int H, int q_len, int splits);
/* flex_fwd_combine: one warp per row of B x H x q_len, 128 threads. */
CgLaunch cg_launch_fwd_combine(const CgOptions *o, int B, int H, int q_len);
/* Key tiles of the forward (ceil(kv_len / block_n)): the most splits a call can use. */
int cg_fwd_kv_tiles(const CgOptions *o, int kv_len);
CgLaunch cg_launch_bwd_pre(const CgOptions *o, int B, int H, int q_len);  /* flex_bwd_pre */
/* flex_bwd: a CTA per key tile; deterministic, cg_bwd_splits CTAs per (kv head, batch). */
CgLaunch cg_launch_bwd(const CgOptions *o, int B, int HKV, int kv_len);
CgLaunch cg_launch_bwd_dq(const CgOptions *o, int B, int H, int q_len);   /* flex_bwd_dq */
/* A deterministic backward's CTAs per (kv head, batch), each with its own
 * dQ slice: enough for about 264 CTAs in all (two per SM of an H100), at
 * most one per key tile; $FLEXC_BWD_SPLITS overrides the 264 / (B HKV). */
int cg_bwd_splits(const CgOptions *o, int B, int HKV, int kv_len);
/* flex_grad_exact over n elements of one buffer gradient (grid-stride, at
 * most 1024 CTAs). */
CgLaunch cg_launch_grad_exact(const CgOptions *o, int64_t n);

/* The BlockMask builder (mask_builder): flex_mask_build classifies the
 * blocks of one query-block row per CTA, flex_mask_lists writes the lists
 * (one thread per row or column of blocks). Bm, Hm: the mask's stored extents. */
CgLaunch cg_launch_mask_build(const CgOptions *o, int Bm, int Hm, int nq);
CgLaunch cg_launch_mask_lists(const CgOptions *o, int Bm, int Hm, int nq, int nkv);
/* The `sorted` check (sorted_check): flex_sorted_check scans one 1-D
 * buffer of n elements, a grid-stride loop of at most 1024 CTAs. */
CgLaunch cg_launch_sorted_check(const CgOptions *o, int64_t n);
/* Block sizes of a BlockMask every kernel of `o` can walk (multiples of the
 * forward and backward tiles): what the builder uses. */
void cg_mask_blocks(const CgOptions *o, int *block_q, int *block_kv);
/* Whether a BlockMask of these block sizes can be walked by the kernels of `o`. */
bool cg_mask_blocks_ok(const CgOptions *o, int block_q, int block_kv);
/* Halves the tensor-core forward's and backward's key tiles (the
 * backward's warps follow) until they divide a caller's BlockMask blocks
 * of block_kv keys (64, say). */
void cg_fit_mask_blocks(CgOptions *o, int block_kv);

/* ---- planning one call (plan.c) ------------------------------------------- */

/* What a backend's device can do, as it states it when a call opens. */
typedef struct CgDevice {
  CgArch arch;        /* the generated kernels' target (unused by a host backend) */
  bool host;          /* runs loops of its own (cpu), not the generated kernels: its tiles
                         are host_fwd / host_bwd, and it never packs or splits */
  CgTiles host_fwd, host_bwd; /* a host backend's block granularity: the BlockMasks it
                         accepts (multiples of these) and builds (cg_mask_blocks) */
  bool tensor_maps;   /* it builds the sm_90a bodies' tensor maps for this call */
  bool watchdog;      /* mbarrier waits trap after 2^33 cycles with a message (FLEX_WATCHDOG) */
  int sms;            /* multiprocessors split-KV fills (0: unknown, CG_SPLIT_DEFAULT_SMS) */
} CgDevice;

/* The SM count split-KV assumes when the device does not say (the
 * emulator: an A100's 108, its default arch being sm_80). */
#define CG_SPLIT_DEFAULT_SMS 108
/* The most key chunks the heuristic picks (a forced count is clamped only
 * to the key tiles). */
#define CG_SPLIT_MAX 64
/* The longest Q_LEN a forward packs the query heads of a group for. */
#define CG_PACK_MAX_Q_LEN 16
/* The longest Q_LEN and KV_LEN for which float(kv - q) is the kernels'
 * flex_dqk (CgOptions.dqk): a row's base kv0 - q and base + k (|k| < 1024)
 * stay below 2^24, where int -> float and their sum are exact. */
#define CG_DQK_MAX ((1 << 24) - 1024)

/* What the plan needs to know of one call. */
typedef struct CgShape {
  CgDtype dtype;          /* what the kernels read (float64 inputs: fp32) */
  int B, H, HKV, QL, KL, E, EV;
  bool backward;
  bool dropout;           /* dropout_p > 0 */
  bool paged;             /* K/V through a page table */
  bool deterministic;     /* a deterministic backward asked for */
  bool tma_ok;            /* q, k, v (and dout) can be TMA-loaded (16-bit, aligned rows) */
  bool out_f32;           /* O is kept in fp32 (another dtype than the kernels', or recomputed) */
  int mask_block_q, mask_block_kv; /* a caller's BlockMask's blocks (0: none) */
  int kv_splits;          /* flex_args.kv_splits: 0 automatic, 1 never, N chunks */
  float scale;            /* the softmax scale (a bias is folded only for |scale| >= 2^-16) */
  bool pack_ok;           /* a group's rows are evenly spaced in q, out and lse */
  bool offsets;           /* position offsets (flex_args.q_offset, kv_offset nonzero) */
  bool check_bounds;      /* a checked run (flex_args.check_bounds) */
} CgShape;

/* Fill `o` for call `s` of module `m` on device `d`: tiles (re-picked for
 * dropout, paging, TMA and a caller's blocks), the sm_90a bodies, the mask
 * mode and builder, grouped-query packing and the forward's key chunks
 * (*splits; 1: whole). False with a message in err when the device cannot
 * run the call. */
bool cg_plan(CgOptions *o, int *splits, const IrModule *m, const CgShape *s, const CgDevice *d,
             char *err, size_t errlen);

/* Names and limits of the architectures. */
const char *cg_arch_name(CgArch a);       /* "sm_80", ... */
bool cg_arch_parse(const char *s, CgArch *out);
size_t cg_arch_smem_limit(CgArch a);      /* max dynamic shared memory per block (opt-in) */
const char *cg_dtype_name(CgDtype d);     /* "fp32", "fp16", "bf16" */
bool cg_dtype_parse(const char *s, CgDtype *out);

#endif
