/* interval.cuh: the integer and boolean interval transfer rules, written
 * once for two compilers: ir/interval.c includes this file as C11 (the
 * host analysis behind BlockMask builders and `flexc mask`), and the
 * generated CUDA includes it for the device-side block classifier
 * `flex_mask_block` (implicit masks, the mask-builder kernel). Both
 * therefore classify a block the same way.
 *
 *   FlexIvI  an int range [lo, hi] (int64 endpoints inside the i32 range;
 *            a result that may leave it may have wrapped: the whole range)
 *   FlexIvB  a three-valued bool {may_false, may_true}
 *
 * Float values have no device rules: the device classifier treats every
 * float as unknown (always sound); the host analysis adds float rules of
 * its own in ir/interval.c. See docs/blockmask.md for the rules.
 */
#ifndef FLEX_INTERVAL_CUH
#define FLEX_INTERVAL_CUH

#if defined(__CUDACC__) || defined(__CUDACC_RTC__) || defined(FLEXC_EMU)
#define FLEX_IV_FN __device__ __forceinline__
/* Interval division and remainder are dozens of 64-bit divisions each: one
 * out-of-line copy per kernel instead of one per use (a NATTEN classifier
 * has a dozen uses); the classifier runs once per tile, not per element. */
#ifdef FLEXC_EMU
#define FLEX_IV_FN_BIG __device__ inline
#else
#define FLEX_IV_FN_BIG __device__ __noinline__
#endif
#else
#include <stdbool.h>
#include <stdint.h>
#define FLEX_IV_FN static inline
#define FLEX_IV_FN_BIG static inline
#endif

#define FLEX_IV_IMIN (-2147483647LL - 1)
#define FLEX_IV_IMAX 2147483647LL

/* How a mask classifies a block: the one enum of the host analysis
 * (ir/interval.h), the device classifier, the builder's class bytes and
 * the reference's walk. */
typedef enum FlexBlockClass {
  FLEX_BLOCK_EMPTY = 0,   /* mask false everywhere: skip */
  FLEX_BLOCK_FULL = 1,    /* mask true everywhere: no per-element test */
  FLEX_BLOCK_PARTIAL = 2, /* mixed, or undecided: test every element */
} FlexBlockClass;

/* An int range. */
typedef struct FlexIvI {
  int64_t lo, hi; /* inclusive bounds */
} FlexIvI;

/* A three-valued bool. */
typedef struct FlexIvB {
  bool may_false, may_true; /* which values are possible */
} FlexIvB;

/* A range; one that may leave the i32 range may have wrapped: the whole range. */
FLEX_IV_FN FlexIvI flex_iv_int(int64_t lo, int64_t hi) {
  FlexIvI r;
  if (lo < FLEX_IV_IMIN || hi > FLEX_IV_IMAX || lo > hi) lo = FLEX_IV_IMIN, hi = FLEX_IV_IMAX;
  r.lo = lo;
  r.hi = hi;
  return r;
}
FLEX_IV_FN FlexIvI flex_iv_top(void) { return flex_iv_int(FLEX_IV_IMIN, FLEX_IV_IMAX); }
FLEX_IV_FN FlexIvB flex_ivb(bool may_false, bool may_true) {
  FlexIvB r;
  r.may_false = may_false;
  r.may_true = may_true;
  return r;
}
FLEX_IV_FN FlexIvB flex_ivb_top(void) { return flex_ivb(true, true); }
FLEX_IV_FN FlexIvB flex_ivb_point(bool v) { return flex_ivb(!v, v); }

FLEX_IV_FN int64_t flex_iv_min(int64_t a, int64_t b) { return a < b ? a : b; }
FLEX_IV_FN int64_t flex_iv_max(int64_t a, int64_t b) { return a > b ? a : b; }
FLEX_IV_FN int64_t flex_iv_abs64(int64_t a) { return a < 0 ? -a : a; }

FLEX_IV_FN FlexIvI flex_iv_join(FlexIvI a, FlexIvI b) {
  return flex_iv_int(flex_iv_min(a.lo, b.lo), flex_iv_max(a.hi, b.hi));
}
FLEX_IV_FN FlexIvB flex_ivb_join(FlexIvB a, FlexIvB b) {
  return flex_ivb(a.may_false || b.may_false, a.may_true || b.may_true);
}

/* ---- arithmetic ------------------------------------------------------------ */

FLEX_IV_FN FlexIvI flex_iv_add(FlexIvI a, FlexIvI b) { return flex_iv_int(a.lo + b.lo, a.hi + b.hi); }
FLEX_IV_FN FlexIvI flex_iv_sub(FlexIvI a, FlexIvI b) { return flex_iv_int(a.lo - b.hi, a.hi - b.lo); }
/* Products of i32 endpoints fit in int64; the extremes are at the corners. */
FLEX_IV_FN FlexIvI flex_iv_mul(FlexIvI a, FlexIvI b) {
  int64_t c0 = a.lo * b.lo, c1 = a.lo * b.hi, c2 = a.hi * b.lo, c3 = a.hi * b.hi;
  return flex_iv_int(flex_iv_min(flex_iv_min(c0, c1), flex_iv_min(c2, c3)),
                     flex_iv_max(flex_iv_max(c0, c1), flex_iv_max(c2, c3)));
}
FLEX_IV_FN FlexIvI flex_iv_imin(FlexIvI a, FlexIvI b) {
  return flex_iv_int(flex_iv_min(a.lo, b.lo), flex_iv_min(a.hi, b.hi));
}
FLEX_IV_FN FlexIvI flex_iv_imax(FlexIvI a, FlexIvI b) {
  return flex_iv_int(flex_iv_max(a.lo, b.lo), flex_iv_max(a.hi, b.hi));
}
FLEX_IV_FN FlexIvI flex_iv_neg(FlexIvI a) { return flex_iv_int(-a.hi, -a.lo); }
/* abs(INT_MIN) wraps to INT_MIN: the range check below makes it the top. */
FLEX_IV_FN FlexIvI flex_iv_iabs(FlexIvI a) {
  if (a.lo >= 0) return a;
  if (a.hi <= 0) return flex_iv_int(-a.hi, -a.lo);
  return flex_iv_int(0, flex_iv_max(-a.lo, a.hi));
}

/* Truncating division with a divisor range that excludes zero: each
 * operand alone moves the quotient monotonically, so corners bound it. */
FLEX_IV_FN_BIG FlexIvI flex_iv_div_nz(FlexIvI a, int64_t d0, int64_t d1) {
  int64_t c0 = a.lo / d0, c1 = a.lo / d1, c2 = a.hi / d0, c3 = a.hi / d1;
  return flex_iv_int(flex_iv_min(flex_iv_min(c0, c1), flex_iv_min(c2, c3)),
                     flex_iv_max(flex_iv_max(c0, c1), flex_iv_max(c2, c3)));
}
/* C division; x / 0 == 0: the divisor splits into negative, zero, positive. */
FLEX_IV_FN_BIG FlexIvI flex_iv_div(FlexIvI a, FlexIvI b) {
  bool have = false;
  FlexIvI r = flex_iv_int(0, 0);
  if (b.lo <= -1) {
    r = flex_iv_div_nz(a, b.lo, b.hi < -1 ? b.hi : -1);
    have = true;
  }
  if (b.hi >= 1) {
    FlexIvI q = flex_iv_div_nz(a, b.lo > 1 ? b.lo : 1, b.hi);
    r = have ? flex_iv_join(r, q) : q;
    have = true;
  }
  if (b.lo <= 0 && b.hi >= 0) r = have ? flex_iv_join(r, flex_iv_int(0, 0)) : flex_iv_int(0, 0);
  return r;
}
/* C remainder; x % 0 == x. Exact when the dividend range has one quotient
 * and one sign (x % m = x - k*m); else |r| < |m|, |r| <= |x|, sign of x. */
FLEX_IV_FN_BIG FlexIvI flex_iv_mod(FlexIvI a, FlexIvI b) {
  if (b.lo == b.hi && b.lo != 0) {
    int64_t m = flex_iv_abs64(b.lo);
    if (a.lo / m == a.hi / m && (a.lo >= 0 || a.hi <= 0)) return flex_iv_int(a.lo % m, a.hi % m);
  }
  int64_t big = flex_iv_max(flex_iv_abs64(b.lo), flex_iv_abs64(b.hi));
  int64_t m = big > 0 ? big - 1 : 0;
  int64_t lo = a.lo >= 0 ? 0 : flex_iv_max(a.lo, -m);
  int64_t hi = a.hi <= 0 ? 0 : flex_iv_min(a.hi, m);
  FlexIvI r = flex_iv_int(lo, hi);
  if (b.lo <= 0 && b.hi >= 0) r = flex_iv_join(r, a);
  return r;
}
FLEX_IV_FN FlexIvI flex_iv_b2i(FlexIvB a) { return flex_iv_int(a.may_false ? 0 : 1, a.may_true ? 1 : 0); }

/* ---- comparisons and logic ---------------------------------------------------- */

FLEX_IV_FN FlexIvB flex_iv_lt(FlexIvI a, FlexIvI b) { return flex_ivb(!(a.hi < b.lo), a.lo < b.hi); }
FLEX_IV_FN FlexIvB flex_iv_le(FlexIvI a, FlexIvI b) { return flex_ivb(!(a.hi <= b.lo), a.lo <= b.hi); }
FLEX_IV_FN FlexIvB flex_iv_eq(FlexIvI a, FlexIvI b) {
  bool disjoint = a.hi < b.lo || b.hi < a.lo;
  bool same = a.lo == a.hi && b.lo == b.hi && a.lo == b.lo;
  return flex_ivb(!same, !disjoint);
}
FLEX_IV_FN FlexIvB flex_iv_ne(FlexIvI a, FlexIvI b) {
  FlexIvB e = flex_iv_eq(a, b);
  return flex_ivb(e.may_true, e.may_false);
}
FLEX_IV_FN FlexIvB flex_ivb_not(FlexIvB a) { return flex_ivb(a.may_true, a.may_false); }
FLEX_IV_FN FlexIvB flex_ivb_and(FlexIvB a, FlexIvB b) {
  return flex_ivb(a.may_false || b.may_false, a.may_true && b.may_true);
}
FLEX_IV_FN FlexIvB flex_ivb_or(FlexIvB a, FlexIvB b) {
  return flex_ivb(a.may_false && b.may_false, a.may_true || b.may_true);
}
/* eq/ne on bools: decided only when both sides are. */
FLEX_IV_FN FlexIvB flex_ivb_eq(FlexIvB a, FlexIvB b) {
  if (a.may_false != a.may_true && b.may_false != b.may_true)
    return flex_ivb_point(a.may_true == b.may_true);
  return flex_ivb_top();
}
FLEX_IV_FN FlexIvB flex_ivb_ne(FlexIvB a, FlexIvB b) { return flex_ivb_not(flex_ivb_eq(a, b)); }
/* select: the chosen branch when the condition is decided, else both. */
FLEX_IV_FN FlexIvI flex_iv_select(FlexIvB c, FlexIvI a, FlexIvI b) {
  return !c.may_false ? a : !c.may_true ? b : flex_iv_join(a, b);
}
FLEX_IV_FN FlexIvB flex_ivb_select(FlexIvB c, FlexIvB a, FlexIvB b) {
  return !c.may_false ? a : !c.may_true ? b : flex_ivb_join(a, b);
}

/* The class of a block from the mask's abstract value over it. */
FLEX_IV_FN int flex_iv_class(FlexIvB v) {
  return !v.may_true ? FLEX_BLOCK_EMPTY : !v.may_false ? FLEX_BLOCK_FULL : FLEX_BLOCK_PARTIAL;
}

#endif /* FLEX_INTERVAL_CUH */
