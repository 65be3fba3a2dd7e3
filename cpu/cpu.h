/* cpu.h: the CPU backend's insides, in pipeline order (not public).
 *
 *   ir_llvm.c  cpu_lower():   IR -> LLVM IR tile functions (score, mask, joint)
 *   jit.c      cpu_jit_get(): optimise for the host, ORC LLJIT, in-memory cache
 *   kern*.c    cpu_kern():    register-blocked matrix products and row
 *                             softmax helpers, one build per ISA level,
 *                             picked at run time (AVX-512, AVX2, baseline)
 *   attn.c     cpu_attn_*():  tiled FlashAttention forward and backward
 *   backend.c  rt_cpu_backend: the verbs of runtime/backend.h (stub.c
 *              instead when flexc is built without LLVM)
 *
 * Everything the tile functions read comes from one FlexParams
 * (kernels/params.cuh), exactly what the CUDA kernels read.
 */
#ifndef FLEXC_CPU_H
#define FLEXC_CPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ir/ir.h"
#include "kernels/params.cuh"
#include "runtime/flex.h"

/* ---- JIT-compiled tile functions ------------------------------------------ */

/* t = score(s) in place over an m x n tile of S (row stride ld); element
 * (i, j) is (q0 + i, kv0 + j). */
typedef void (*CpuScoreFn)(float *S, int64_t ld, int32_t m, int32_t n, int32_t b, int32_t h,
                           int32_t q0, int32_t kv0, const FlexParams *p);
/* keep[i * ld + j] = mask(b, h, q0 + i, kv0 + j) (1 or 0). */
typedef void (*CpuMaskFn)(uint8_t *keep, int64_t ld, int32_t m, int32_t n, int32_t b, int32_t h,
                          int32_t q0, int32_t kv0, const FlexParams *p);
/* DS holds dt on entry and ds on return, 0 wherever P is 0 (the joint is not
 * evaluated there); S is the pre-score s. ACCUMs add into acc[slot]. */
typedef void (*CpuJointFn)(float *DS, const float *S, const float *P, int64_t ld, int32_t m,
                           int32_t n, int32_t b, int32_t h, int32_t q0, int32_t kv0,
                           const FlexParams *p, float *const *acc);

/* The sink's gradient into grad buffers: DT[i * ld] is row q0 + i's dsk
 * (the tile's one column; n is 1); ACCUMs add into acc[slot]. */
typedef void (*CpuSinkGradFn)(float *DT, int64_t ld, int32_t m, int32_t n, int32_t b, int32_t h,
                              int32_t q0, int32_t kv0, const FlexParams *p, float *const *acc);

/* The compiled functions of one module and option set (owned by the JIT). */
typedef struct CpuModule {
  CpuScoreFn score;      /* t = score(s); NULL when the score is the identity */
  CpuScoreFn score_mask; /* t = mask ? score(s) : -inf; NULL without a mask */
  CpuMaskFn mask;        /* the mask alone (BlockMask builder); NULL without a mask */
  CpuJointFn joint;      /* ds from dt; NULL when not asked for or ds == dt */
  CpuScoreFn sink;       /* S[i * ld] = sink(b, h, q0 + i) (n is 1, S not read); NULL without a sink */
  CpuSinkGradFn sink_grad; /* NULL when not asked for or no sink */
  double compile_s;      /* seconds its lowering, optimisation, compilation and linking took */
  bool from_disk;        /* the object code came from the module store */
} CpuModule;

/* What cpu_jit_get compiles. */
typedef struct CpuJitOpts {
  bool joint;        /* also the joint (backward, unless ds == dt) */
  bool identity;     /* the score is the identity: no score function */
  bool check_bounds; /* buffer accesses tested; the first failure recorded in p->bounds */
  bool exact;        /* a deterministic backward: ACCUMs call cpu_exact_add */
  bool sink_grad;    /* also the sink's gradient (a backward of a kernel with a sink) */
} CpuJitOpts;

/* The module's functions: linked already, or their object code from the
 * module store (base/store.h), or compiled and stored (keyed by the printed
 * IR, the options and the host). FLEX_OK, or a status with the message set
 * (rt_err). Thread-safe. */
flex_status cpu_jit_get(const IrModule *m, const CpuJitOpts *o, const CpuModule **out);
/* FLEX_OK when the JIT starts on this host (created on first use), else why not. */
flex_status cpu_jit_ready(void);
/* How many modules are linked into the JIT (tests, benchmarks). */
int cpu_jit_cache_size(void);
/* For tests: forget every linked module (its code stays in the JIT), so
 * the next cpu_jit_get of each compiles it afresh under new names. The
 * store must not serve the old object back (FLEXC_CACHE_DIR=off and
 * base_store_clear_memory): the JIT would refuse its names a second time.
 * No call may be running. */
void cpu_jit_forget(void);

/* Lower m's functions into `llvm_module` (an LLVMModuleRef) named with
 * `prefix`: PREFIX_score, PREFIX_score_mask, PREFIX_mask, PREFIX_joint,
 * PREFIX_sink, PREFIX_sink_grad (those that apply). False with a message in err for an op this backend
 * does not know. */
bool cpu_lower(void *llvm_module, const IrModule *m, const CpuJitOpts *o, const char *prefix,
               char *err, size_t errlen);
/* Element i of an exact accumulator (kernels/exact.cuh) += v: the ACCUM
 * of a deterministic backward's joint, into the worker's own accumulator. */
void cpu_exact_add(int64_t *acc, int64_t i, float v);
/* The checked-run record call the lowered code makes (as flex_bounds_fail). */
void cpu_bounds_fail(int32_t *bounds, int32_t site, int32_t n, int32_t i0, int32_t i1, int32_t i2,
                     int32_t i3, int32_t i4, int32_t i5, int32_t i6, int32_t i7);

/* ---- the thread pool ---------------------------------------------------------- */

/* ---- kernels (one table per ISA level) ------------------------------------------ */

/* Row-major products and row helpers over fp32. Column counts of B and C
 * are padded by the caller to a multiple of cpu_kern()->nr (zeros in the
 * padding), so the kernels never need a column tail. */
typedef struct CpuKern {
  const char *name; /* "avx512bf16", "avx512", "avx2", "generic" */
  int nr;           /* column multiple the kernels need */
  /* C[m x n] (+)= A[m x k] . B[k x n] (acc: add to C; else overwrite); A's
   * element (r, p) is A[r * ars + p * aps] (A^T: swap the strides). */
  void (*gemm)(int m, int n, int k, const float *A, int64_t ars, int64_t aps, const float *B,
               int64_t ldb, float *C, int64_t ldc, bool acc);
  /* x[j] = exp(x[j] - mx) for j < n (mx finite), returning the sum (NaN propagates). */
  float (*exp_sum)(float *x, int n, float mx);
  /* x[j] = exp(x[j] - lse) for j < n (0 where x is -inf). */
  void (*exp_sub)(float *x, int n, float lse);
  /* The largest of x[0..n) (-inf for none; NaN if any is NaN). */
  float (*row_max)(const float *x, int n);
  /* y[j] *= a for j < n. */
  void (*scale)(float *y, int n, float a);
  /* dt[j] = P[j] * (dP[j] - D) for j < n (in place in dP). */
  void (*dt_row)(float *dP, const float *P, int n, float D);
  /* n fp16 or bf16 (bf16 true) values to fp32. */
  void (*from16)(float *dst, const uint16_t *src, int n, bool bf16);
  /* n values src[j] * mul rounded once to fp16 or bf16 (nearest even). */
  void (*to16)(uint16_t *dst, const float *src, int n, float mul, bool bf16);
  /* bf16 products, NULL below AVX512-BF16 (kern.h): C[m x n] = alpha A B,
   * or C += alpha A B (acc), n a multiple of 32. A is bf16 row-major with
   * lda 32-bit words (bf16 pairs along k) a row; B is k2 rows of words, each
   * word the pair (B[2p][j], B[2p+1][j]), ldb words apart; k = 2 k2. */
  void (*gemm_bf16)(int m, int n, int k2, const uint32_t *A, int64_t lda, const uint32_t *B,
                    int64_t ldb, float *C, int64_t ldc, float alpha, bool acc);
  /* The forward's bf16 P, x left as it was: dst[j] = exp(x[j] - mx)
   * rounded to bf16 (nearest even) for j < n and dst[n] = 0 when n is odd;
   * returns the sum of the bf16 values as stored. Its exp is a cheaper one than
   * exp_sum's (1.6e-7 relative, kern.h), as P is bf16 anyway. */
  float (*exp_sum_bf16)(uint16_t *dst, const float *x, int n, float mx);
} CpuKern;

/* The JIT's vector math (kern.h), one set per width (the 8- and 16-lane
 * sets in x86-64 builds only): by function (CPU_VM_*, named "tanh", "sin",
 * "cos", "erf" in cpu_vm_names), the address of cpu_<f>_v<lanes> on `lanes`
 * floats (the vector ABI's argument and result), and cpu_<f>f_<lanes>,
 * the scalar function that gives those lanes' bits. */
enum { CPU_VM_TANH, CPU_VM_SIN, CPU_VM_COS, CPU_VM_ERF, CPU_VM_COUNT };
extern const char *const cpu_vm_names[CPU_VM_COUNT];
typedef struct CpuVmath {
  int lanes;
  void (*vec[CPU_VM_COUNT])(void);      /* vector functions, by address */
  float (*scalar[CPU_VM_COUNT])(float); /* their lane 0 */
} CpuVmath;
extern const CpuVmath cpu_vmath_4, cpu_vmath_8, cpu_vmath_16;
/* The widest vector the host's JIT code may pass a variant: 16, 8 or 4
 * lanes; and whether glibc's libmvec is loaded (jit.c). */
int cpu_jit_lanes(void);
bool cpu_jit_mvec(void);

/* The best table for this CPU. */
const CpuKern *cpu_kern(void);
extern const CpuKern cpu_kern_avx512bf16, cpu_kern_avx512, cpu_kern_avx2, cpu_kern_generic;

#endif
