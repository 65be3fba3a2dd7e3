/* emu_cuda.h: the CUDA shim that lets generated kernels compile as host
 * C++17 (g++ -DFLEXC_EMU). It provides exactly what the kernel contract
 * allows: the function qualifiers, threadIdx/blockIdx/blockDim/gridDim,
 * __syncthreads[_or], the full-mask shuffles and votes, min/max/abs, the float math
 * functions (the host's, as the device's accurate versions), INFINITY, and
 * dynamic shared memory declared as
 *     extern __shared__ __align__(16) unsigned char flex_smem[];
 * The runtime force-includes this file (-include emu_cuda.h) ahead of the
 * generated source. */
#ifndef FLEXC_EMU_CUDA_H
#define FLEXC_EMU_CUDA_H

#ifndef __cplusplus
#error "emu_cuda.h is compiled as C++17"
#endif

#include "emu_core.h"

/* ---- qualifiers --------------------------------------------------------- */
#define __global__
#define __device__
#define __host__
#if EMU_HOOKED
#define __forceinline__ inline
#else
#define __forceinline__ inline __attribute__((always_inline))
#endif
#define __launch_bounds__(...)
#define FLEX_NOINLINE __attribute__((noinline))
#define __grid_constant__
#define __align__(n) __attribute__((aligned(n)))
#define __restrict__ __restrict
/* Shared memory is per OS thread (one block runs per OS thread at a time). */
#define __shared__ thread_local

/* Exports a kernel so the runtime can call it through void (*)(const void *). */
#define FLEX_EMU_ENTRY(NAME, PARAMS)                                                  \
  extern "C" __attribute__((visibility("default"))) void NAME##_emu(const void *p) { \
    NAME(*(const PARAMS *)p);                                                         \
  }

/* ---- thread coordinates --------------------------------------------------- */
typedef EmuDim3 uint3;
typedef EmuDim3 dim3;
#define threadIdx (emu_cur->tidx)
#define blockIdx (emu_w->bidx)
#define blockDim (emu_block_dim)
#define gridDim (emu_grid_dim)

/* ---- barriers and shuffles ------------------------------------------------ */

/* A block barrier: every thread of the block must arrive. */
EMU_API static void __syncthreads(void) { emu_block_wait(EMU_AT_BAR); }
/* The same, returning whether any thread's predicate was nonzero. */
EMU_API static int __syncthreads_or(int pred) {
  emu_w->sync_or |= pred != 0;
  emu_block_wait(EMU_AT_BAR);
  return emu_w->last_or;
}

EMU_NOSAN static void emu_nop_fn(EmuReq **, int) {}
/* A warp barrier (all 32 lanes). */
EMU_API static void __syncwarp(unsigned mask = 0xffffffffu) {
  EmuReq r = {};
  r.fn = emu_nop_fn, r.name = "__syncwarp", r.mask = mask;
  emu_warp_op(&r);
}

/* Shuffle semantics (PTX shfl.sync): lanes are split into segments of
 * `width`; a source outside the lane's segment gives the lane's own value
 * (for idx the source wraps inside the segment). */
enum { EMU_SHFL_IDX, EMU_SHFL_XOR, EMU_SHFL_DOWN };
EMU_NOSAN static void emu_shfl_fn(EmuReq **lanes, int n) {
  for (int l = 0; l < n; l++) {
    EmuReq *r = lanes[l];
    int w = r->width, seg = l & ~(w - 1), src = l;
    int op = (int)(intptr_t)r->a;
    if (op == EMU_SHFL_IDX) src = seg + (r->arg & (w - 1));
    else if (op == EMU_SHFL_XOR) src = l ^ r->arg;
    else src = l + r->arg;
    if (op != EMU_SHFL_IDX && (src < seg || src >= seg + w)) src = l;
    if (src >= n) src = l;
    r->result = lanes[src]->val;
  }
}

EMU_API static uint64_t emu_shfl(int op, const char *name, unsigned mask, uint64_t v, int arg, int width) {
  if (width < 1 || width > 32 || (width & (width - 1)))
    emu_fail("%s: width %d is not a power of two in 1..32", name, width);
  EmuReq r = {};
  r.fn = emu_shfl_fn, r.name = name, r.mask = mask, r.val = v, r.arg = arg, r.width = width;
  r.a = (const void *)(intptr_t)op;
  emu_warp_op(&r);
  return r.result;
}

template <class T> static inline T emu_shfl_t(int op, const char *name, unsigned mask, T v, int arg, int width) {
  static_assert(sizeof(T) <= 8, "shuffles move at most 8 bytes");
  uint64_t bits = 0;
  memcpy(&bits, &v, sizeof(T));
  bits = emu_shfl(op, name, mask, bits, arg, width);
  T out;
  memcpy(&out, &bits, sizeof(T));
  return out;
}
template <class T> static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
  return emu_shfl_t(EMU_SHFL_IDX, "__shfl_sync", mask, v, src, width);
}
template <class T> static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  return emu_shfl_t(EMU_SHFL_XOR, "__shfl_xor_sync", mask, v, lane_mask, width);
}
template <class T> static inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  return emu_shfl_t(EMU_SHFL_DOWN, "__shfl_down_sync", mask, v, (int)delta, width);
}

/* Warp votes (PTX vote.sync.any / .all): every lane of `mask` gets the
 * OR (AND) of their predicates. */
EMU_NOSAN static void emu_vote_fn(EmuReq **lanes, int n) {
  uint64_t any = 0, all = 1;
  for (int l = 0; l < n; l++) any |= lanes[l]->val != 0, all &= lanes[l]->val != 0;
  for (int l = 0; l < n; l++) lanes[l]->result = (intptr_t)lanes[l]->a ? all : any;
}
EMU_API static int emu_vote(int all, const char *name, unsigned mask, int pred) {
  EmuReq r = {};
  r.fn = emu_vote_fn, r.name = name, r.mask = mask, r.val = pred != 0;
  r.a = (const void *)(intptr_t)all;
  emu_warp_op(&r);
  return (int)r.result;
}
static inline int __any_sync(unsigned mask, int pred) { return emu_vote(0, "__any_sync", mask, pred); }
static inline int __all_sync(unsigned mask, int pred) { return emu_vote(1, "__all_sync", mask, pred); }

/* ---- integer helpers (CUDA's overloads) ------------------------------------- */
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
static inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
static inline float min(float a, float b) { return fminf(a, b); }
static inline float max(float a, float b) { return fmaxf(a, b); }

/* ---- float helpers CUDA has and the host's libm lacks ------------------------ */
/* The device's rsqrtf is accurate (2 ulp), so an exact 1/sqrt stands in. */
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }

#endif
