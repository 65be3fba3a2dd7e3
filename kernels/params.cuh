/* params.cuh: the one parameter struct every kernel entry takes by value.
 *
 * Shared by the generated CUDA (NVRTC), the emulator (host C++) and the
 * runtime (C11), so it is plain C: pointers, integers and floats only.
 * Fields are grouped outputs, then inputs, then sizes. Strides are in
 * elements; the last dimension of q, k, v, out, dout, dq, dk, dv is unit.
 */
#ifndef FLEX_PARAMS_CUH
#define FLEX_PARAMS_CUH

#if !defined(__CUDACC__) && !defined(__CUDACC_RTC__)
#include <stdint.h>
#endif

#define FLEX_MAX_PARAMS 16  /* runtime scalar params per kernel */
#define FLEX_MAX_BUFFERS 16 /* buffers per kernel */
#define FLEX_MAX_SIZES 24   /* B H HKV Q_LEN KV_LEN TOTAL_Q TOTAL_KV Q_START KV_START, then free symbols */
#define FLEX_WALK_BYTES 256 /* shared memory of a tensor-core walk and its published runs */
/* Bytes per staged dQ row of the sm_90a backward (flex_bwd_sm90's DQB) at
 * padded head dim EPT: EPT floats and 16 bytes of padding, which spreads a
 * warp's 8-byte stores over the banks; 16-byte aligned, as a bulk
 * reduction's source must be. */
#define FLEX_BWD_SM90_DQ_ROW(EPT) (4 * (EPT) + 16)

/* Element strides of a [B, heads, rows, cols] tensor (cols are unit-stride). */
typedef struct FlexStrides {
  int64_t b, h, row; /* batch, head and row strides */
} FlexStrides;

/* One side of a PyTorch-layout block mask: num [B, H, nrows] and
 * idx [B, H, nrows, ncols], int32. A broadcast B or H has stride 0. */
typedef struct FlexBlockList {
  const int32_t *num;         /* blocks listed per row of blocks; NULL: no list */
  const int32_t *idx;         /* the listed block indices */
  int64_t num_b, num_h, num_r; /* element strides of num */
  int64_t idx_b, idx_h, idx_r; /* element strides of idx (last dim unit) */
} FlexBlockList;

/* Everything one launch of flex_fwd, flex_bwd_pre, flex_bwd, flex_bwd_dq,
 * flex_grad_exact, the BlockMask builder or flex_sorted_check reads and writes. Fields a kernel does not use may be left zero. */
typedef struct FlexParams {
  /* ---- outputs ---- */
  void *out;           /* forward: O [B, H, Q_LEN, EV], input dtype (fp32 when generated so) */
  float *lse;          /* forward: LSE [B, H, Q_LEN] fp32, natural log */
  void *dq, *dk, *dv;  /* backward: gradients, input dtype, shaped like q, k, v */
  float *dq_acc;       /* backward: fp32 dQ accumulator [B, H, Q_LEN, E], contiguous; zeroed by
                          flex_bwd_pre (deterministic: dq_splits such slices) */
  float *delta;        /* backward: D [B, H, Q_LEN] fp32, contiguous; written by flex_bwd_pre */
  float *dnorm;        /* backward, or NULL: sum |dO| per row [B, H, Q_LEN] fp32, contiguous; written
                          by flex_bwd_pre (the sm_90a backward's bound on dP; without it no
                          tile takes that kernel's steady body) */
  float *buf_grad[FLEX_MAX_BUFFERS]; /* backward: fp32 accumulators of `grad` buffers (dense row-major, zeroed by the caller) */
  /* ---- inputs ---- */
  const void *q, *k, *v;   /* Q [B,H,Q_LEN,E], K [B,HKV,KV_LEN,E], V [B,HKV,KV_LEN,EV] */
  const void *dout;        /* backward: dO like out */
  const float *dlse;       /* backward: dLSE [B, H, Q_LEN] fp32 contiguous, or NULL */
  const void *buf[FLEX_MAX_BUFFERS]; /* user buffers by slot, dense row-major in their own dtype */
  const int32_t *pages;    /* paged K/V (kernels generated paged): this sequence's page table row;
                              k and v are then page pools, sk.b and sv.b their page strides */
  float pf[FLEX_MAX_PARAMS];   /* float params by slot */
  int32_t pi[FLEX_MAX_PARAMS]; /* int params by slot */
  FlexBlockList kv_list, full_kv_list; /* forward walk: partial and full key blocks per query block */
  FlexBlockList q_list, full_q_list;   /* backward walk: partial and full query blocks per key block */
  /* ---- sizes and strides ---- */
  FlexStrides sq, sk, sv, so;      /* q, k, v, out */
  FlexStrides sdo, sdq, sdk, sdv;  /* dout, dq, dk, dv */
  int64_t lse_b, lse_h;            /* element strides of lse (row stride 1); also used for dlse */
  int32_t sizes[FLEX_MAX_SIZES];   /* by IR size slot: B H HKV Q_LEN KV_LEN, then free symbols */
  int32_t B, H, HKV, G, q_len, kv_len, E, EV; /* G = H / HKV */
  int32_t b0;                      /* functions see batch index b as b + b0 (a packed call's sequence) */
  int32_t q_off, kv_off;           /* position offsets (kernels generated with FLEX_OFFSETS): functions
                                      and dropout bits see row q as q + q_off, key kv as kv + kv_off */
  int32_t block_q, block_kv;       /* block-mask block sizes (multiples of the kernel's tiles) */
  int32_t vec16;                   /* nonzero: q/k/v/dout rows are 16-byte aligned (cp.async path) */
  int32_t page_size;               /* paged K/V: keys per page (key kv is row kv % page_size of
                                      page pages[kv / page_size]) */
  float scale;                     /* softmax scale (1/sqrt(E) by default) */
  /* ---- dropout (docs/language.md; read only by kernels generated with FLEX_DROPOUT) ---- */
  float drop_p;                    /* probability of dropping a weight, in [0, 1) */
  float drop_scale;                /* 1 / (1 - drop_p): what a kept weight is multiplied by */
  uint32_t drop_seed[2];           /* Philox key (seed_lo, seed_hi) */
  uint32_t drop_ctr3;              /* Philox counter word 3: offset_lo + offset_hi, wrapping */
  /* ---- the BlockMask builder (flex_mask_build, flex_mask_lists) ---- */
  unsigned char *mask_cls;         /* class byte per block [mask_B, mask_H, mask_nq, mask_nkv] */
  int32_t *mask_out[8];            /* kv_num, kv_idx, full_kv_num, full_kv_idx, q_num, q_idx, full_q_num, full_q_idx */
  int32_t mask_B, mask_H;          /* the mask's stored batch and head extents (1: broadcast) */
  int32_t mask_nq, mask_nkv;       /* query and key blocks of block_q x block_kv */
  /* ---- checked runs ---- */
  int32_t *bounds;                 /* FLEX_BOUNDS_WORDS: the first failed buffer access; NULL: unchecked */
  /* ---- the `sorted` check (flex_sorted_check) ---- */
  uint64_t *sorted_rec;            /* the record: the largest sorted_len - i over the i with buf[i] < buf[i-1] (0: none) */
  int64_t sorted_len;              /* elements of buf[sorted_slot] (1-D) */
  int32_t sorted_slot;             /* the buffer checked */
  int32_t sorted_bytes;            /* its element: 1 (u8, unsigned), 4 (i32) or 8 (i64) */
  /* ---- split-KV decoding (flex_fwd split, flex_fwd_combine; docs/decoding.md) ---- */
  int32_t kv_splits;               /* S chunks of the key range; <= 1: flex_fwd writes out and lse */
  float *part_o;                   /* S > 1: partial O [S, B, H, Q_LEN, EV] fp32, each normalised
                                      by its own row sum */
  float *part_lse;                 /* S > 1: partial LSE [S, B, H, Q_LEN] fp32 (-inf: no live key) */
  /* ---- grouped-query packing (kernels generated with CgOptions.pack_gqa) ---- */
  int32_t pack_g;                  /* G: H and G above are then HKV and 1, q_len G Q_LEN */
  int32_t pack_q_len;              /* the call's Q_LEN */
  /* ---- a deterministic backward (read only by kernels generated with
   * FLEX_DETERMINISTIC; docs/kernels.md "Deterministic backward"; last, so
   * the fields every other kernel reads keep their offsets) ---- */
  int32_t dq_splits;               /* flex_bwd's grid width: CTA x adds dQ into slice x of dq_acc */
  int64_t dq_split_stride;         /* elements between slices (B * H * Q_LEN * E) */
  int64_t *grad_exact[FLEX_MAX_BUFFERS]; /* exact accumulators of the `grad` buffers:
                                      FLEX_EXACT_WORDS words per element (kernels/exact.cuh) */
  int64_t exact_len;               /* flex_grad_exact: elements of buffer exact_slot */
  int32_t exact_slot;              /* flex_grad_exact: the buffer rounded into buf_grad */
} FlexParams;

/* The 128 bytes of a CUtensorMap, 64-byte aligned, as cuTensorMapEncodeTiled
 * writes them (the emulator's FlexTensorMap, emu/emu_abi.h, fits in them). */
typedef struct __attribute__((aligned(64))) FlexTmapBytes {
  uint64_t w[16];
} FlexTmapBytes;

/* The parameter of the sm_90a forward (kernels/flex_fwd_sm90.cuh), a
 * __grid_constant__ so the TMA units read the maps from parameter space:
 * the call's FlexParams and the tensor maps of q, k and v, each 4-D
 * {E, rows, heads, B} with a box of 64 columns (128-byte swizzle). */
typedef struct FlexFwdTma {
  FlexParams p;
  FlexTmapBytes tq, tk, tv;
} FlexFwdTma;

/* The parameter of the sm_90a backward (kernels/flex_bwd_sm90.cuh): the
 * call's FlexParams and the maps of q, k, v and dout, boxes of 64 rows. */
typedef struct FlexBwdTma {
  FlexParams p;
  FlexTmapBytes tq, tk, tv, tdo;
} FlexBwdTma;

/* The checked-run record: [0] nonzero once a load failed, [1] its site
 * ((function kind << 16) | instruction index, bit 30 set for an i64 value
 * that does not fit in 32 bits), [2] the index count, [3..10] the indices. */
#define FLEX_BOUNDS_WORDS 11
#define FLEX_BOUNDS_I64 (1 << 30)

#endif /* FLEX_PARAMS_CUH */
