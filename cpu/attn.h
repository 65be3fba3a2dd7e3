/* attn.h: the attention entries of the CPU backend (attn.c) and what they
 * share with the backend's verbs (backend.c). */
#ifndef FLEXC_CPU_ATTN_H
#define FLEXC_CPU_ATTN_H

#include <stdatomic.h>

#include "codegen/codegen.h"
#include "cpu/cpu.h"
#include "kernels/interval.cuh" /* FlexBlockClass: the walk's class bytes */

/* The most query tiles one forward item runs together (CpuAttn.qgroup). */
enum { CPU_FWD_QGROUP_MAX = 8 };

/* Which tiles a call visits and which need the mask. */
typedef struct CpuWalk {
  uint8_t *cls;          /* class per [Bm][Hm][nq][nkv] block (NULL: every tile full) */
  int Bm, Hm;            /* stored batch and head extents of cls (1: broadcast) */
  int nq, nkv;           /* blocks down and across */
  int block_q, block_kv; /* query rows and keys one class covers */
} CpuWalk;

/* Everything one entry's workers share. */
typedef struct CpuAttn {
  const FlexParams *p;    /* the call */
  const CpuModule *mod;   /* the JIT's tile functions */
  const CpuKern *K;       /* the kernels for this CPU */
  CpuWalk walk;           /* tile classes */
  CgDtype dtype;          /* q, k, v, dout and outputs */
  CgDtype out_dtype;      /* O: dtype, or CG_FP32 for an fp32 O (CgOptions.out_f32) */
  bool bf16;              /* forward: bf16 inputs multiplied by K->gemm_bf16 (attn.c) */
  int E, EV, Ep, EVp;     /* head dims and their padding to K->nr */
  int bm, bn, bnp;        /* query rows and keys per tile; bn padded to K->nr */
  int nqt, nkt;           /* query and key tiles */
  int qgroup, kvchunk;    /* forward: query tiles an item runs together, key tiles they walk at a time */
  float *kt, *vp;         /* forward: K^T [heads][E][ldk] and V [heads][KL][EVp] in fp32, for a chunk of heads */
  int64_t ldk;            /* row stride of kt */
  int64_t chunk0;         /* forward: the first key/value head (b * HKV + kvh) packed in kt, vp */
  float *scratch;         /* per-worker scratch, scratch_per floats each */
  size_t scratch_per;     /* floats of scratch per worker */
  float **acc;            /* backward: [worker][FLEX_MAX_BUFFERS] buffer-gradient accumulators */
  _Atomic int *locks;     /* backward: a spin lock per (b, h, query tile) of dq_acc; deterministic:
                             the key tiles that have passed it (their dQ added, or none to add) */
  bool deterministic;     /* backward: dQ added in key-tile order (attn.c) */
  _Atomic uint64_t tiles; /* tiles visited (stats) */
} CpuAttn;

/* The entries; a is set up by the backend (tiles, walk, scratch). */
void cpu_attn_fwd(CpuAttn *a);
void cpu_attn_bwd_pre(CpuAttn *a);
void cpu_attn_bwd(CpuAttn *a);
void cpu_attn_bwd_dq(CpuAttn *a);
/* Floats of scratch one forward (backward) worker needs. */
size_t cpu_attn_fwd_scratch(const CpuAttn *a);
size_t cpu_attn_bwd_scratch(const CpuAttn *a);

#endif
