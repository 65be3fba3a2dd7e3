/* scalar.cuh: the DSL's integer rules, written once for two compilers: the
 * IR (ir/ir.h, C11: folding, the float64 interpreter, interval analysis)
 * and the generated CUDA (through common.cuh) include this file, so the
 * compiler and the kernels cannot disagree on what `/`, `%` or a wrap is.
 *
 * int is 32-bit two's complement and wraps; x / 0 == 0 and x % 0 == x
 * (docs/language.md "Types"); INT_MIN / -1 wraps to INT_MIN and INT_MIN % -1 == 0.
 */
#ifndef FLEX_SCALAR_CUH
#define FLEX_SCALAR_CUH

#if defined(__CUDACC__) || defined(__CUDACC_RTC__) || defined(FLEXC_EMU)
#define FLEX_SC_FN __device__ __forceinline__
#else
#include <stdint.h>
#define FLEX_SC_FN static inline
#endif

/* The range rules below are large: one out-of-line copy on devices and in
 * the emulator keeps the block classifier (many calls) quick to compile.
 * Not for sm_90a: there a call in a kernel with setmaxnreg and wgmma (the
 * walk's classifier, in the producer warpgroup) made ptxas fail register
 * allocation outright (C7600, at any register count) for a classifier with
 * shifts or bit operations, so the sm_90a module inlines them. */
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FLEX_RANGE_FN __device__ __forceinline__
#elif defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define FLEX_RANGE_FN __device__ __noinline__
#elif defined(FLEXC_EMU)
#define FLEX_RANGE_FN inline __attribute__((noinline))
#else
#define FLEX_RANGE_FN static inline
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

/* Shifts (docs/language.md "Types"): a count outside 0..31 acts as 32, the PTX
 * shl/shr rule: x << n gives 0 and x >> n gives 0 or -1 by the sign of x.
 * `>>` is arithmetic (written without shifting a negative number). */
FLEX_SC_FN int32_t flex_shl(int32_t a, int32_t n) {
  return n < 0 || n > 31 ? 0 : (int32_t)((uint32_t)a << n);
}
FLEX_SC_FN int32_t flex_shr(int32_t a, int32_t n) {
  if (n < 0 || n > 31) return a < 0 ? -1 : 0;
  return a < 0 ? ~(int32_t)((uint32_t)~a >> n) : (int32_t)((uint32_t)a >> n);
}
/* Python's // and % (rounding toward minus infinity); floordiv(a, 0) == 0,
 * floormod(a, 0) == a; INT_MIN floordiv -1 wraps to INT_MIN. */
FLEX_SC_FN int32_t flex_floordiv(int32_t a, int32_t b) {
  int32_t q = flex_idiv(a, b);
  return b != 0 && flex_imod(a, b) != 0 && ((a < 0) != (b < 0)) ? q - 1 : q;
}
FLEX_SC_FN int32_t flex_floormod(int32_t a, int32_t b) {
  int32_t r = flex_imod(a, b);
  return b != 0 && r != 0 && ((r < 0) != (b < 0)) ? r + b : r;
}

/* ---- range rules of the ops above ---------------------------------------
 * kernels/interval.cuh holds the interval rules of the other integer ops;
 * the rules of these live here, over plain int64 end points, so that the
 * IR's analysis and the device classifier share them too: flex_range2()
 * bounds op(x, y) for x in [alo, ahi], y in [blo, bhi] (inclusive, inside
 * the i32 range) and writes [*lo, *hi]; a bound it cannot give is the
 * whole i32 range. The flex_iv_* wrappers at the end take and give FlexIvI
 * (they are macros, so this file need not come after interval.cuh). */
#define FLEX_RANGE_AND 0
#define FLEX_RANGE_OR 1
#define FLEX_RANGE_XOR 2
#define FLEX_RANGE_SHL 3
#define FLEX_RANGE_SHR 4
#define FLEX_RANGE_FLOORDIV 5
#define FLEX_RANGE_FLOORMOD 6

/* Hacker's Delight 4-3: exact bounds of x | y, x & y, x ^ y for unsigned x
 * in [a, b], y in [c, d]. */
FLEX_SC_FN uint32_t flex_min_or(uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  for (uint32_t m = 0x80000000u; m; m >>= 1) {
    if (~a & c & m) {
      uint32_t t = (a | m) & (0u - m);
      if (t <= b) { a = t; break; }
    } else if (a & ~c & m) {
      uint32_t t = (c | m) & (0u - m);
      if (t <= d) { c = t; break; }
    }
  }
  return a | c;
}
FLEX_SC_FN uint32_t flex_max_or(uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  for (uint32_t m = 0x80000000u; m; m >>= 1) {
    if (b & d & m) {
      uint32_t t = (b - m) | (m - 1);
      if (t >= a) { b = t; break; }
      t = (d - m) | (m - 1);
      if (t >= c) { d = t; break; }
    }
  }
  return b | d;
}
FLEX_SC_FN uint32_t flex_min_and(uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  for (uint32_t m = 0x80000000u; m; m >>= 1) {
    if (~a & ~c & m) {
      uint32_t t = (a | m) & (0u - m);
      if (t <= b) { a = t; break; }
      t = (c | m) & (0u - m);
      if (t <= d) { c = t; break; }
    }
  }
  return a & c;
}
FLEX_SC_FN uint32_t flex_max_and(uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  for (uint32_t m = 0x80000000u; m; m >>= 1) {
    if (b & ~d & m) {
      uint32_t t = (b & ~m) | (m - 1);
      if (t >= a) { b = t; break; }
    } else if (~b & d & m) {
      uint32_t t = (d & ~m) | (m - 1);
      if (t >= c) { d = t; break; }
    }
  }
  return b & d;
}
FLEX_SC_FN uint32_t flex_min_xor(uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  for (uint32_t m = 0x80000000u; m; m >>= 1) {
    if (~a & c & m) {
      uint32_t t = (a | m) & (0u - m);
      if (t <= b) a = t;
    } else if (a & ~c & m) {
      uint32_t t = (c | m) & (0u - m);
      if (t <= d) c = t;
    }
  }
  return a ^ c;
}
FLEX_SC_FN uint32_t flex_max_xor(uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  for (uint32_t m = 0x80000000u; m; m >>= 1) {
    if (b & d & m) {
      uint32_t t = (b - m) | (m - 1);
      if (t >= a) b = t;
      else {
        t = (d - m) | (m - 1);
        if (t >= c) d = t;
      }
    }
  }
  return b ^ d;
}

/* Bitwise op over one sign class of each operand: the bit patterns of a
 * range that does not cross zero are an unsigned range in the same order,
 * and the result's sign is fixed, so its patterns map back in order. */
FLEX_SC_FN void flex_range_bits(int op, int64_t alo, int64_t ahi, int64_t blo, int64_t bhi,
                                int64_t *lo, int64_t *hi) {
  uint32_t a = (uint32_t)(int32_t)alo, b = (uint32_t)(int32_t)ahi;
  uint32_t c = (uint32_t)(int32_t)blo, d = (uint32_t)(int32_t)bhi;
  uint32_t l, h;
  if (op == FLEX_RANGE_AND) l = flex_min_and(a, b, c, d), h = flex_max_and(a, b, c, d);
  else if (op == FLEX_RANGE_OR) l = flex_min_or(a, b, c, d), h = flex_max_or(a, b, c, d);
  else l = flex_min_xor(a, b, c, d), h = flex_max_xor(a, b, c, d);
  *lo = (int32_t)l;
  *hi = (int32_t)h;
}

/* Join [l, h] into [*lo, *hi] (empty when *lo > *hi). */
FLEX_SC_FN void flex_range_join(int64_t *lo, int64_t *hi, int64_t l, int64_t h) {
  if (l < *lo) *lo = l;
  if (h > *hi) *hi = h;
}

FLEX_SC_FN int64_t flex_range_floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

FLEX_RANGE_FN void flex_range2(int op, int64_t alo, int64_t ahi, int64_t blo, int64_t bhi,
                               int64_t *lo, int64_t *hi) {
  const int64_t imin = -2147483647LL - 1, imax = 2147483647LL;
  *lo = imax + 1;
  *hi = imin - 1;
  if (op <= FLEX_RANGE_XOR) { /* each sign class of each operand */
    for (int sa = 0; sa < 2; sa++)
      for (int sb = 0; sb < 2; sb++) {
        int64_t al = sa ? (alo > 0 ? alo : 0) : alo, ah = sa ? ahi : (ahi < -1 ? ahi : -1);
        int64_t bl = sb ? (blo > 0 ? blo : 0) : blo, bh = sb ? bhi : (bhi < -1 ? bhi : -1);
        if (al > ah || bl > bh) continue;
        int64_t l, h;
        flex_range_bits(op, al, ah, bl, bh, &l, &h);
        flex_range_join(lo, hi, l, h);
      }
    return;
  }
  if (op == FLEX_RANGE_SHL || op == FLEX_RANGE_SHR) {
    if (blo < 0 || bhi > 31) { /* a count outside 0..31 */
      if (op == FLEX_RANGE_SHL || ahi >= 0) flex_range_join(lo, hi, 0, 0);
      if (op == FLEX_RANGE_SHR && alo < 0) flex_range_join(lo, hi, -1, -1);
    }
    int64_t n0 = blo < 0 ? 0 : blo, n1 = bhi > 31 ? 31 : bhi;
    for (int64_t n = n0; n <= n1; n++) {
      if (op == FLEX_RANGE_SHR) { /* monotone in x */
        flex_range_join(lo, hi, flex_shr((int32_t)alo, (int32_t)n), flex_shr((int32_t)ahi, (int32_t)n));
        continue;
      }
      int64_t l = alo * ((int64_t)1 << n), h = ahi * ((int64_t)1 << n);
      if (l < imin || h > imax) { /* some value wraps */
        *lo = imin, *hi = imax;
        return;
      }
      flex_range_join(lo, hi, l, h);
    }
    return;
  }
  /* floordiv, floormod: a divisor range through zero is split; 0 itself
   * gives 0 (floordiv) or a (floormod). */
  if (blo <= 0 && bhi >= 0) {
    if (op == FLEX_RANGE_FLOORDIV) flex_range_join(lo, hi, 0, 0);
    else flex_range_join(lo, hi, alo, ahi);
  }
  for (int s = 0; s < 2; s++) {
    int64_t bl = s ? (blo > 1 ? blo : 1) : blo, bh = s ? bhi : (bhi < -1 ? bhi : -1);
    if (bl > bh) continue;
    if (op == FLEX_RANGE_FLOORDIV) { /* monotone in each operand on a sign class: corners */
      int64_t c0 = flex_range_floor_div(alo, bl), c1 = flex_range_floor_div(alo, bh);
      int64_t c2 = flex_range_floor_div(ahi, bl), c3 = flex_range_floor_div(ahi, bh);
      int64_t l = c0 < c1 ? c0 : c1, h = c0 > c1 ? c0 : c1;
      l = l < c2 ? l : c2, h = h > c2 ? h : c2;
      l = l < c3 ? l : c3, h = h > c3 ? h : c3;
      if (h > imax) { /* INT_MIN floordiv -1 wraps */
        *lo = imin, *hi = imax;
        return;
      }
      flex_range_join(lo, hi, l, h);
    } else if (bl == bh && flex_range_floor_div(alo, bl) == flex_range_floor_div(ahi, bl)) {
      /* one divisor, one period: a shifted copy of a */
      int64_t k = flex_range_floor_div(alo, bl) * bl;
      flex_range_join(lo, hi, alo - k, ahi - k);
    } else if (s) { /* 0 <= r < b; r == a when 0 <= a < b */
      if (alo >= 0 && ahi < bl) flex_range_join(lo, hi, alo, ahi);
      else flex_range_join(lo, hi, 0, bh - 1);
    } else { /* b < r <= 0; r == a when b < a <= 0 */
      if (ahi <= 0 && alo > bh) flex_range_join(lo, hi, alo, ahi);
      else flex_range_join(lo, hi, bl + 1, 0);
    }
  }
  if (*lo > *hi) *lo = imin, *hi = imax; /* cannot happen: every case joins */
}
FLEX_SC_FN int64_t flex_range2_lo(int op, int64_t alo, int64_t ahi, int64_t blo, int64_t bhi) {
  int64_t lo, hi;
  flex_range2(op, alo, ahi, blo, bhi, &lo, &hi);
  return lo;
}
FLEX_SC_FN int64_t flex_range2_hi(int op, int64_t alo, int64_t ahi, int64_t blo, int64_t bhi) {
  int64_t lo, hi;
  flex_range2(op, alo, ahi, blo, bhi, &lo, &hi);
  return hi;
}

/* The interval rules (FlexIvI in, FlexIvI out; ops.def's IV column). */
#define FLEX_IV_RANGE2(op, x, y)                                                             \
  flex_iv_int(flex_range2_lo(op, (x).lo, (x).hi, (y).lo, (y).hi),                          \
              flex_range2_hi(op, (x).lo, (x).hi, (y).lo, (y).hi))
#define flex_iv_band(x, y) FLEX_IV_RANGE2(FLEX_RANGE_AND, x, y)
#define flex_iv_bor(x, y) FLEX_IV_RANGE2(FLEX_RANGE_OR, x, y)
#define flex_iv_bxor(x, y) FLEX_IV_RANGE2(FLEX_RANGE_XOR, x, y)
#define flex_iv_shl(x, y) FLEX_IV_RANGE2(FLEX_RANGE_SHL, x, y)
#define flex_iv_shr(x, y) FLEX_IV_RANGE2(FLEX_RANGE_SHR, x, y)
#define flex_iv_floordiv(x, y) FLEX_IV_RANGE2(FLEX_RANGE_FLOORDIV, x, y)
#define flex_iv_floormod(x, y) FLEX_IV_RANGE2(FLEX_RANGE_FLOORMOD, x, y)
/* ~x == -x - 1: exact */
#define flex_iv_bnot(x) flex_iv_int(-(x).hi - 1, -(x).lo - 1)

#endif /* FLEX_SCALAR_CUH */
