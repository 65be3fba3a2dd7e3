/* arch.cuh: the only inline PTX of the kernels.
 *
 * Every warp-level instruction the templates use goes through one of these
 * wrappers, so the CPU emulator (runtime/emu/emu_arch.h) can replace them
 * with functions of the same names and signatures, emulated from the PTX
 * ISA's documented fragment layouts.
 *
 *   flex_mma_f16 / flex_mma_bf16   mma.sync m16n8k16, fp32 accumulate
 *   flex_ldmatrix_x{1,2,4}[_trans] ldmatrix m8n8 b16 from shared memory
 *   flex_cp_async_16 / commit / wait   16-byte cp.async with zero fill
 *   flex_f2h flex_h2f flex_f2bf flex_bf2f flex_pack_h2 flex_pack_bf2
 *   flex_gload flex_gstore flex_atomic_add   every global-memory access
 *   flex_atomic_cas                          32-bit compare-and-swap (checked runs)
 *   flex_approx_{exp,log,log2,tanh,sin,cos,pow}   fast math only (opt-in)
 */
#ifndef FLEX_ARCH_CUH
#define FLEX_ARCH_CUH

#ifdef FLEXC_EMU
#include "emu_arch.h"
#else

typedef unsigned int uint32_t;
typedef int int32_t;
typedef unsigned short uint16_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;

#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif

/* The emulator defines this to export a callable wrapper per entry. */
#define FLEX_EMU_ENTRY(NAME, PARAMS)

/* Shared-memory address of a generic pointer, as PTX shared-space operands want. */
__device__ __forceinline__ uint32_t flex_smem_addr(const void *p) {
  uint32_t a;
  asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }"
               : "=r"(a) : "l"(p));
  return a;
}

/* D = A * B + C, A 16x16 row-major, B 16x8 column-major, fp16 in, fp32 out. */
__device__ __forceinline__ void flex_mma_f16(float d[4], const uint32_t a[4], const uint32_t b[2],
                                             const float c[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
        "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}

/* The same with bf16 inputs. */
__device__ __forceinline__ void flex_mma_bf16(float d[4], const uint32_t a[4], const uint32_t b[2],
                                              const float c[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
        "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}

/* ldmatrix: each lane passes the address of one 16-byte row (lanes 0-7 the
 * rows of matrix 0, 8-15 of matrix 1, ...). */
__device__ __forceinline__ void flex_ldmatrix_x1(uint32_t r[1], const void *smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n"
               : "=r"(r[0]) : "r"(flex_smem_addr(smem)));
}
__device__ __forceinline__ void flex_ldmatrix_x2(uint32_t r[2], const void *smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1]) : "r"(flex_smem_addr(smem)));
}
__device__ __forceinline__ void flex_ldmatrix_x4(uint32_t r[4], const void *smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(flex_smem_addr(smem)));
}
__device__ __forceinline__ void flex_ldmatrix_x1_trans(uint32_t r[1], const void *smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n"
               : "=r"(r[0]) : "r"(flex_smem_addr(smem)));
}
__device__ __forceinline__ void flex_ldmatrix_x2_trans(uint32_t r[2], const void *smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1]) : "r"(flex_smem_addr(smem)));
}
__device__ __forceinline__ void flex_ldmatrix_x4_trans(uint32_t r[4], const void *smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(flex_smem_addr(smem)));
}

/* 16-byte global -> shared copy; with !pred the destination is zero-filled
 * and gmem is not read (src-size 0). */
__device__ __forceinline__ void flex_cp_async_16(void *smem, const void *gmem, bool pred) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
               :: "r"(flex_smem_addr(smem)), "l"(gmem), "r"(pred ? 16 : 0) : "memory");
}
__device__ __forceinline__ void flex_cp_async_commit(void) {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void flex_cp_async_wait(void) {
  asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
}

/* fp16 / bf16 bit patterns <-> fp32, round to nearest even. */
__device__ __forceinline__ uint16_t flex_f2h(float x) {
  uint16_t r;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(x));
  return r;
}
__device__ __forceinline__ float flex_h2f(uint16_t x) {
  float r;
  asm("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"(x));
  return r;
}
__device__ __forceinline__ uint16_t flex_f2bf(float x) {
  uint16_t r;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(x));
  return r;
}
__device__ __forceinline__ float flex_bf2f(uint16_t x) {
  return __uint_as_float((uint32_t)x << 16);
}
/* Two halves in one register, lo in bits 0..15 (the cvt puts its first
 * source in the upper half). */
__device__ __forceinline__ uint32_t flex_pack_h2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
__device__ __forceinline__ uint32_t flex_pack_bf2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

/* Fast math, an explicit opt-in: CUDA's approximate intrinsics, and the
 * hardware tanh (sm_75 on; the PTX ISA gives its maximum relative error as 2^-10.987;
 * not measured here). */
__device__ __forceinline__ float flex_approx_exp(float x) { return __expf(x); }
__device__ __forceinline__ float flex_approx_log(float x) { return __logf(x); }
__device__ __forceinline__ float flex_approx_log2(float x) { return __log2f(x); }
__device__ __forceinline__ float flex_approx_tanh(float x) {
  float r;
  asm("tanh.approx.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
__device__ __forceinline__ float flex_approx_sin(float x) { return __sinf(x); }
__device__ __forceinline__ float flex_approx_cos(float x) { return __cosf(x); }
__device__ __forceinline__ float flex_approx_pow(float x, float y) { return __powf(x, y); }

/* Global memory: every read and write of the kernels goes through these so
 * the emulator can check bounds. */
template <class T> __device__ __forceinline__ T flex_gload(const T *p) { return *p; }
template <class T> __device__ __forceinline__ void flex_gstore(T *p, T v) { *p = v; }
__device__ __forceinline__ void flex_atomic_add(float *p, float v) { atomicAdd(p, v); }
__device__ __forceinline__ int32_t flex_atomic_cas(int32_t *p, int32_t cmp, int32_t v) {
  return atomicCAS((int *)p, cmp, v);
}

#endif /* FLEXC_EMU */
#endif /* FLEX_ARCH_CUH */
