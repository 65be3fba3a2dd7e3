/* scalar.cuh: the DSL's integer rules, written once for two compilers: the
 * IR (ir/ir.h, C11: folding, the float64 interpreter, interval analysis)
 * and the generated CUDA (through common.cuh) include this file, so the
 * compiler and the kernels cannot disagree on what `/`, `%` or a wrap is.
 *
 * int is 32-bit two's complement and wraps; x / 0 == 0 and x % 0 == x
 * (DSL.md "Types"); INT_MIN / -1 wraps to INT_MIN and INT_MIN % -1 == 0.
 */
#ifndef FLEX_SCALAR_CUH
#define FLEX_SCALAR_CUH

#if defined(__CUDACC__) || defined(__CUDACC_RTC__) || defined(FLEXC_EMU)
#define FLEX_SC_FN __device__ __forceinline__
#else
#include <stdint.h>
#define FLEX_SC_FN static inline
#endif

FLEX_SC_FN int32_t flex_iadd(int32_t a, int32_t b) { return (int32_t)((uint32_t)a + (uint32_t)b); }
FLEX_SC_FN int32_t flex_isub(int32_t a, int32_t b) { return (int32_t)((uint32_t)a - (uint32_t)b); }
FLEX_SC_FN int32_t flex_imul(int32_t a, int32_t b) { return (int32_t)((uint32_t)a * (uint32_t)b); }
FLEX_SC_FN int32_t flex_ineg(int32_t a) { return (int32_t)(0u - (uint32_t)a); }
FLEX_SC_FN int32_t flex_iabs(int32_t a) { return a < 0 ? flex_ineg(a) : a; }
/* C division truncating toward zero; x / 0 == 0; INT_MIN / -1 wraps. */
FLEX_SC_FN int32_t flex_idiv(int32_t a, int32_t b) {
  if (b == 0) return 0;
  if (b == -1) return flex_ineg(a);
  return a / b;
}
/* C remainder; x % 0 == x; INT_MIN % -1 == 0. */
FLEX_SC_FN int32_t flex_imod(int32_t a, int32_t b) {
  if (b == 0) return a;
  if (b == -1) return 0;
  return a % b;
}

#endif /* FLEX_SCALAR_CUH */
