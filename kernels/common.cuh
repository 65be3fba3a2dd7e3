/* common.cuh: what every kernel template and every generated device
 * function needs: the arch wrappers, the params struct, the DSL's integer
 * and conversion rules, element types and the block-mask walk. */
#ifndef FLEX_COMMON_CUH
#define FLEX_COMMON_CUH

#include "arch.cuh"
#include "params.cuh"
#include "philox.cuh"
#include "exact.cuh"

/* Dropout is compiled in only where the generated file defines
 * FLEX_DROPOUT (CgOptions.dropout, p > 0): without it every use below is
 * dead code and p = 0 costs nothing. */
#ifdef FLEX_DROPOUT
#define FLEX_DROP true
#else
#define FLEX_DROP false
#endif

/* An attention sink (docs/language.md "Attention sinks"; the generated flex_sink and
 * flex_sink_grad): FLEX_SINK defined. Without it the code below is dead. */
#ifdef FLEX_SINK
#define FLEX_HAS_SINK true
#else
#define FLEX_HAS_SINK false
#endif

/* Split-KV likewise (CgOptions.kv_split, FLEX_KV_SPLIT defined): only the
 * forward of a split call carries the chunk arithmetic and the partials'
 * stores, so every other forward is the code it was without them. */
#ifdef FLEX_KV_SPLIT
#define FLEX_SPLIT true
#else
#define FLEX_SPLIT false
#endif

/* A compile-time flag as a value (a generic lambda's template argument:
 * decltype(x)::value). */
template <bool B> struct FlexBool {
  static constexpr bool value = B;
};

/* min(x, 0) keeping a NaN (fminf would drop it): the exponent of a
 * backward's P, which cannot pass 1 but may where a huge row's LSE was
 * rounded below its max (docs/kernels.md, "Huge scores"). */
__device__ __forceinline__ float flex_nonpos(float x) { return x > 0.0f ? 0.0f : x; }
/* Position offsets (docs/language.md "Position offsets"; CgOptions.offsets,
 * FLEX_OFFSETS defined): a shard's functions and dropout bits see row qi
 * as position qi + p.q_off and key kj as kj + p.kv_off. Without them the
 * positions are the rows, at no cost. */
#ifdef FLEX_OFFSETS
#define FLEX_Q_OFF(p) (p).q_off
#define FLEX_KV_OFF(p) (p).kv_off
#else
#define FLEX_Q_OFF(p) 0
#define FLEX_KV_OFF(p) 0
#endif

/* Whether element (qi, kj) of batch b (as the kernel indexes it; functions
 * and the bits see b + b0 and the positions) and query head h is kept
 * (docs/language.md "Dropout"). */
__device__ __forceinline__ bool flex_drop_keep(const FlexParams &p, int b, int h, int qi, int kj) {
  qi += FLEX_Q_OFF(p), kj += FLEX_KV_OFF(p);
  uint32_t w[4];
  flex_dropout_words(w, p.drop_seed[0], p.drop_seed[1], p.drop_ctr3,
                     (uint32_t)((b + p.b0) * p.H + h), (uint32_t)qi, (uint32_t)kj >> 2);
  return flex_dropout_keep(flex_dropout_word(w, (uint32_t)kj & 3), p.drop_p);
}

/* The same for the two keys kj, kj + 1 of one row, kj even: one Philox call
 * (two where an odd key offset puts them in two words). */
__device__ __forceinline__ void flex_drop_keep2(const FlexParams &p, int b, int h, int qi, int kj,
                                                bool keep[2]) {
  if (FLEX_KV_OFF(p) & 1) {
    keep[0] = flex_drop_keep(p, b, h, qi, kj), keep[1] = flex_drop_keep(p, b, h, qi, kj + 1);
    return;
  }
  qi += FLEX_Q_OFF(p), kj += FLEX_KV_OFF(p);
  uint32_t w[4];
  flex_dropout_words(w, p.drop_seed[0], p.drop_seed[1], p.drop_ctr3,
                     (uint32_t)((b + p.b0) * p.H + h), (uint32_t)qi, (uint32_t)kj >> 2);
  const bool hi = kj & 2;
  keep[0] = flex_dropout_keep(hi ? w[2] : w[0], p.drop_p);
  keep[1] = flex_dropout_keep(hi ? w[3] : w[1], p.drop_p);
}

/* A deterministic backward is compiled in only where the generated file
 * defines FLEX_DETERMINISTIC (CgOptions.deterministic): without it the
 * backward is the atomic one, unchanged (docs/kernels.md). */
#ifdef FLEX_DETERMINISTIC
#define FLEX_DET true
#else
#define FLEX_DET false
#endif

/* dQ += v. Atomic; in a deterministic backward the CTA's own slice of
 * dq_acc, which no other CTA writes and which the CTA's threads add to one
 * key tile after another, each element by one thread: a plain add. */
__device__ __forceinline__ void flex_dq_add(float *p, float v) {
  if (FLEX_DET) flex_gstore(p, flex_gload(p) + v);
  else flex_atomic_add(p, v);
}

/* *p += v summed over the warp (every lane calls it, converged): a
 * gradient element a whole tile adds to (the generated flex_acc_flush),
 * one atomic a warp where each element took one, all on the same address.
 * A sum of exactly zero adds nothing; a NaN or an infinity is added. */
__device__ __forceinline__ void flex_warp_add(float *p, float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0 && v != 0.0f) flex_atomic_add(p, v);
}

/* Element i of an exact accumulator (exact.cuh) += v: integer atomics, so
 * any order of the same adds leaves the same words. */
__device__ __forceinline__ void flex_exact_add(int64_t *acc, int64_t i, float v) {
  int64_t *w = acc + i * FLEX_EXACT_WORDS, lo, hi;
  uint32_t flag;
  const int l = flex_exact_split(v, &lo, &hi, &flag);
  if (l >= 0) {
    if (lo) flex_atomic_add_i64(w + l, lo);
    if (hi) flex_atomic_add_i64(w + l + 1, hi);
  } else if (flag) {
    flex_atomic_or_u64((uint64_t *)(w + FLEX_EXACT_LIMBS), flag);
  }
}

#define FLEX_LOG2E 1.4426950408889634f
#define FLEX_LN2 0.6931471805599453f

/* float(kv - q) of an element whose kv - q is base + k, the last argument
 * of flex_score and flex_joint (CgOptions.dqk: a user function's
 * float(kv - q) reads it). In the tile loops base is the thread's first
 * key minus a row's query, converted once per tile, and k the element's
 * constant offset from it in the unrolled loops: one add an element
 * instead of an integer subtract and a conversion (a quarter-rate
 * instruction). Exact while |base| and |base + k| are below 2^24, as
 * cg_plan makes sure. */
__device__ __forceinline__ float flex_dqk(int base, int k) { return (float)base + (float)k; }

/* ---- the DSL's integer rules: 32-bit wrapping, defined division ---------- */

#include "scalar.cuh"

/* float -> int truncating toward zero, saturating; NaN gives 0. */
__device__ __forceinline__ int flex_f2i(float x) {
  if (x != x) return 0;
  if (x >= 2147483648.0f) return 2147483647;
  if (x <= -2147483648.0f) return -2147483647 - 1;
  return (int)x;
}

/* ---- the DSL's inexact float builtins ------------------------------------
 * Accurate by default (CUDA's libm: a few ulp), as docs/language.md requires. A
 * generated file that defines FLEX_FAST_MATH (flexc's explicit opt-in)
 * gets the hardware approximations instead (arch.cuh's flex_approx_*:
 * __expf and friends, tanh.approx.f32 for tanh and sigmoid, __fdividef
 * for `/`, which is otherwise IEEE division). */
#ifdef FLEX_FAST_MATH
__device__ __forceinline__ float flex_exp(float x) { return flex_approx_exp(x); }
__device__ __forceinline__ float flex_log(float x) { return flex_approx_log(x); }
__device__ __forceinline__ float flex_log2(float x) { return flex_approx_log2(x); }
__device__ __forceinline__ float flex_tanh(float x) { return flex_approx_tanh(x); }
__device__ __forceinline__ float flex_sigmoid(float x) { return fmaf(0.5f, flex_approx_tanh(0.5f * x), 0.5f); }
__device__ __forceinline__ float flex_sin(float x) { return flex_approx_sin(x); }
__device__ __forceinline__ float flex_cos(float x) { return flex_approx_cos(x); }
__device__ __forceinline__ float flex_pow(float x, float y) { return flex_approx_pow(x, y); }
__device__ __forceinline__ float flex_fdiv(float x, float y) { return flex_approx_div(x, y); }
__device__ __forceinline__ float flex_fdiv_uniform(float x, float y) { return flex_approx_div(x, y); }
#else
__device__ __forceinline__ float flex_exp(float x) { return expf(x); }
__device__ __forceinline__ float flex_log(float x) { return logf(x); }
__device__ __forceinline__ float flex_log2(float x) { return log2f(x); }
__device__ __forceinline__ float flex_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ float flex_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float flex_sin(float x) { return sinf(x); }
__device__ __forceinline__ float flex_cos(float x) { return cosf(x); }
__device__ __forceinline__ float flex_pow(float x, float y) { return powf(x, y); }
__device__ __forceinline__ float flex_fdiv(float x, float y) { return x / y; }
/* x / y where y is the same for a whole tile (codegen/func.c's
 * per_element): x k times the approximate reciprocal of y k (arch.cuh's
 * flex_rcp, one MUFU.RCP within an ulp), which the device compiler can
 * take out of the tile loop, where IEEE division is about seven
 * instructions an element and a branch to its slow path. k = 2^64 for
 * |y| < 2^-126 and 2^-64 for |y| > 2^126 keeps y k and its reciprocal
 * normal numbers; x k is exact unless it overflows (then x / y does too) or
 * underflows (x / y is below 2^-188 and rounds to zero either way). Two
 * roundings and the reciprocal's ulp; zeros, infinities, signs and NaNs
 * are IEEE division's. */
__device__ __forceinline__ float flex_fdiv_uniform(float x, float y) {
  const float a = fabsf(y), k = a < 0x1p-126f ? 0x1p64f : a > 0x1p126f ? 0x1p-64f : 1.0f;
  return x * k * flex_rcp(y * k);
}
#endif

/* Checked runs: record the first failed buffer access (see FLEX_BOUNDS_WORDS);
 * the runtime turns it into "buffer 'NAME' [i, j] (shape [..]) at FILE:L:C". */
__device__ __forceinline__ void flex_bounds_fail(const FlexParams &p, int site, int n, int i0,
                                                 int i1, int i2, int i3, int i4, int i5, int i6,
                                                 int i7) {
  if (!p.bounds || flex_atomic_cas(p.bounds, 0, 1) != 0) return;
  const int v[8] = {i0, i1, i2, i3, i4, i5, i6, i7};
  flex_gstore(p.bounds + 1, (int32_t)site);
  flex_gstore(p.bounds + 2, (int32_t)n);
  for (int d = 0; d < 8; d++) flex_gstore(p.bounds + 3 + d, (int32_t)v[d]);
}

/* ---- element types: storage <-> fp32 ------------------------------------ */

/* fp32 storage. */
struct FlexF32 {
  typedef float T;
  static __device__ __forceinline__ float load(const T *p) { return flex_gload(p); }
  static __device__ __forceinline__ void store(T *p, float x) { flex_gstore(p, x); }
};
/* fp16 storage as uint16_t bit patterns. */
struct FlexF16 {
  typedef uint16_t T;
  static __device__ __forceinline__ float load(const T *p) { return flex_h2f(flex_gload(p)); }
  static __device__ __forceinline__ void store(T *p, float x) { flex_gstore(p, flex_f2h(x)); }
  /* x * f, rounded once (exact for f = -1, 0, NaN and +-inf) */
  static __device__ __forceinline__ T mul(T x, float f) { return flex_f2h(flex_h2f(x) * f); }
  static __device__ __forceinline__ float f32(T x) { return flex_h2f(x); }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) { return flex_pack_h2(lo, hi); }
  static __device__ __forceinline__ void mma(float d[4], const uint32_t a[4], const uint32_t b[2]) {
    flex_mma_f16(d, a, b, d);
  }
};
/* bf16 storage as uint16_t bit patterns. */
struct FlexBF16 {
  typedef uint16_t T;
  static __device__ __forceinline__ float load(const T *p) { return flex_bf2f(flex_gload(p)); }
  static __device__ __forceinline__ void store(T *p, float x) { flex_gstore(p, flex_f2bf(x)); }
  /* x * f, rounded once (exact for f = -1, 0, NaN and +-inf) */
  static __device__ __forceinline__ T mul(T x, float f) { return flex_f2bf(flex_bf2f(x) * f); }
  static __device__ __forceinline__ float f32(T x) { return flex_bf2f(x); }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) { return flex_pack_bf2(lo, hi); }
  static __device__ __forceinline__ void mma(float d[4], const uint32_t a[4], const uint32_t b[2]) {
    flex_mma_bf16(d, a, b, d);
  }
};

/* ---- kernel features (template arguments of the kernel bodies) ----------- */

enum FlexMaskMode {
  FLEX_MASK_NONE = 0,  /* no mask: every key block, no per-element test */
  FLEX_MASK_LISTS = 1, /* walk the BlockMask lists; per-element mask on partial blocks only */
  FLEX_MASK_DENSE = 2, /* walk every block and evaluate the mask per element */
};

extern __shared__ __align__(16) unsigned char flex_smem[];

#endif /* FLEX_COMMON_CUH */
