/* kern.h: the CPU kernels, written once over GCC vector types of VW floats
 * and compiled once per ISA level: kern_avx512bf16.c and kern_avx512.c
 * (VW 16), kern_avx2.c (VW 8) and kern_generic.c (VW 4, SSE2) each set VW,
 * MR and KERN_NAME, a `#pragma GCC target` where needed, and include this
 * file, which defines the table KERN_TABLE; KERN_BF16 adds the bf16
 * products (AVX512-BF16). cpu_kern() picks one at run time, so the library
 * needs no -march flag. Where VW is 16, exp, the row max and the row sum
 * use AVX-512 intrinsics (vscalefps, mask registers, tree reductions).
 *
 * gemm is a register-blocked micro-kernel: MR rows x 2 vectors of C held in
 * registers while k runs, A broadcast one element at a time (any row and
 * column strides, so A^T B needs no transpose), B read a row at a time (B
 * panels of k x 2VW stay in L1). exp is Cephes expf's
 * reduction and polynomial (as the JIT's, cpu/ir_llvm.c), branch-free.
 * These files build with -ffp-contract=fast so a*b+c becomes an FMA.
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "cpu/cpu.h"
#include "runtime/tensor.h"
#if VW >= 8
#include <immintrin.h>
#endif

typedef float vf __attribute__((vector_size(VW * 4)));
typedef int32_t vi __attribute__((vector_size(VW * 4)));
/* Unaligned, aliasing views for loads and stores. */
typedef float vfu __attribute__((vector_size(VW * 4), aligned(4), may_alias));

#define NR (2 * VW)
#define LD(p) ((vf)(*(const vfu *)(p)))
#define ST(p, x) (*(vfu *)(p) = (x))

/* A broadcast: x - 0.0 is x for every x (-0.0 and NaN included), so GCC
 * folds the subtraction and keeps one vbroadcastss at -O2 and -O3 alike
 * (`0.0 + x` is not x for -0.0, and an element-wise build becomes a
 * chain of masked inserts at -O3). */
static inline vf splat(float x) { return x - (vf){0}; }
static inline vf vsel(vi m, vf a, vf b) { return (vf)((m & (vi)a) | (~m & (vi)b)); }

/* MR x NR block of C (rows mr <= MR, a compile-time constant after inlining). */
static inline __attribute__((always_inline)) void block(const int mr, int k, const float *A,
                                                         int64_t ars, int64_t aps, const float *B,
                                                         int64_t ldb, float *C, int64_t ldc, bool acc) {
  vf c0[MR], c1[MR];
#pragma GCC unroll 16
  for (int r = 0; r < mr; r++) {
    c0[r] = acc ? LD(C + r * ldc) : splat(0);
    c1[r] = acc ? LD(C + r * ldc + VW) : splat(0);
  }
  for (int p = 0; p < k; p++, A += aps) {
    vf b0 = LD(B + p * ldb), b1 = LD(B + p * ldb + VW);
#pragma GCC unroll 16
    for (int r = 0; r < mr; r++) {
      vf a = splat(A[r * ars]);
      c0[r] += a * b0;
      c1[r] += a * b1;
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < mr; r++) {
    ST(C + r * ldc, c0[r]);
    ST(C + r * ldc + VW, c1[r]);
  }
}

/* The row tail (fewer than MR rows) with a constant row count. */
static void tail(int mr, int k, const float *A, int64_t ars, int64_t aps, const float *B,
                 int64_t ldb, float *C, int64_t ldc, bool acc) {
  switch (mr) {
#define ROWS(R) case R: block(R, k, A, ars, aps, B, ldb, C, ldc, acc); break;
  ROWS(1) ROWS(2) ROWS(3) ROWS(4) ROWS(5)
#if MR >= 8
  ROWS(6) ROWS(7)
#endif
#undef ROWS
  default: break;
  }
}

static void gemm(int m, int n, int k, const float *A, int64_t ars, int64_t aps, const float *B,
                 int64_t ldb, float *C, int64_t ldc, bool acc) {
  for (int j = 0; j < n; j += NR) {
    int i = 0;
    for (; i + MR <= m; i += MR)
      block(MR, k, A + i * ars, ars, aps, B + j, ldb, C + i * ldc + j, ldc, acc);
    if (i < m) tail(m - i, k, A + i * ars, ars, aps, B + j, ldb, C + i * ldc + j, ldc, acc);
  }
}

/* e^x for a vector: 1-2 ulp; overflow +inf, underflow 0, NaN kept. */
#if VW == 16
/* AVX-512: the same reduction (n = round(x log2 e), r = x - n ln 2 in two
 * parts) and polynomial, with vroundscaleps for the rounding and vscalefps
 * for y 2^n, which overflows to +inf and underflows to 0 by itself: about
 * half the instructions of the portable version below. x is clamped to
 * [-104, 89] first (e^-104 rounds to 0, e^89 to +inf) so that +-inf do
 * not make r = inf - inf; min and max are ordered so that a NaN x is kept. */
static inline vf vexp(vf x) {
  __m512 xc = _mm512_min_ps(_mm512_set1_ps(89.0f), _mm512_max_ps(_mm512_set1_ps(-104.0f), (__m512)x));
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 y = _mm512_set1_ps(1.9875691500E-4f);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507E-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073E-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894E-2f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459E-1f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201E-1f));
  y = _mm512_add_ps(_mm512_fmadd_ps(y, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
  return (vf)_mm512_scalef_ps(y, n);
}
#else
static inline vf vexp(vf x) {
  const float hi = 88.72283935546875f, lo = -103.972084045410f;
  vf xc = vsel(x < splat(lo), splat(lo), x);
  xc = vsel(xc > splat(hi), splat(hi), xc);
  vf t = xc * 1.44269504088896341f + 0.5f;
  vi n = __builtin_convertvector(t, vi);
  vf nf = __builtin_convertvector(n, vf);
  vi adj = nf > t; /* truncation rounded up a negative: floor */
  n += adj;        /* -1 where adj */
  nf = __builtin_convertvector(n, vf);
  vf r = xc - nf * 0.693359375f;
  r = r - nf * -2.12194440e-4f;
  vf y = splat(1.9875691500E-4f);
  y = y * r + 1.3981999507E-3f;
  y = y * r + 8.3334519073E-3f;
  y = y * r + 4.1665795894E-2f;
  y = y * r + 1.6666665459E-1f;
  y = y * r + 5.0000001201E-1f;
  y = y * r * r + r + 1.0f;
  vi n1 = n >> 1, n2 = n - n1;
  y = y * (vf)((n1 + 127) << 23) * (vf)((n2 + 127) << 23);
  y = vsel(x > splat(hi), splat(INFINITY), y);
  y = vsel(x < splat(lo), splat(0), y);
  return vsel(x != x, x, y);
}
#endif

/* Load n < VW floats, the rest `fill`. */
static inline vf load_part(const float *x, int n, float fill) {
  float t[VW];
  for (int i = 0; i < VW; i++) t[i] = i < n ? x[i] : fill;
  return LD(t);
}
static inline void store_part(float *x, int n, vf v) {
  float t[VW];
  ST(t, v);
  memcpy(x, t, sizeof(float) * (size_t)n);
}

/* A tree of adds (16 dependent scalar adds cost a third of a 128-key row's
 * exp_sum on AVX-512). */
static inline float hsum(vf v) {
#if VW == 16
  return _mm512_reduce_add_ps((__m512)v);
#else
  float t[VW];
  ST(t, v);
  for (int w = VW / 2; w > 0; w /= 2)
    for (int i = 0; i < w; i++) t[i] += t[i + w];
  return t[0];
#endif
}

static float exp_sum(float *x, int n, float mx) {
  vf s = splat(0);
  int j = 0;
  for (; j + VW <= n; j += VW) {
    vf e = vexp(LD(x + j) - mx);
    ST(x + j, e);
    s += e;
  }
  if (j < n) {
    vf e = vexp(load_part(x + j, n - j, -INFINITY) - mx);
    store_part(x + j, n - j, e);
    s += e;
  }
  return hsum(s);
}

static void exp_sub(float *x, int n, float lse) {
  int j = 0;
  for (; j + VW <= n; j += VW) {
    vf v = LD(x + j);
    ST(x + j, vsel(v == splat(-INFINITY), splat(0), vexp(v - lse)));
  }
  if (j < n) {
    vf v = load_part(x + j, n - j, -INFINITY);
    store_part(x + j, n - j, vsel(v == splat(-INFINITY), splat(0), vexp(v - lse)));
  }
}

#if VW == 16
/* AVX-512: vmaxps returns its second operand where either is NaN, so
 * max(v, m) ignores a NaN v; NaNs are noted in a mask register instead. */
static float row_max(const float *x, int n) {
  __m512 m = _mm512_set1_ps(-INFINITY);
  __mmask16 nan = 0;
  int j = 0;
  for (; j + VW <= n; j += VW) {
    __m512 v = _mm512_loadu_ps(x + j);
    nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    m = _mm512_max_ps(v, m);
  }
  if (j < n) {
    __m512 v = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), (__mmask16)((1u << (n - j)) - 1), x + j);
    nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    m = _mm512_max_ps(v, m);
  }
  return nan ? NAN : _mm512_reduce_max_ps(m);
}
#else
static float row_max(const float *x, int n) {
  vf m = splat(-INFINITY);
  vi nan = {0};
  int j = 0;
  for (; j + VW <= n; j += VW) {
    vf v = LD(x + j);
    nan |= v != v;
    m = vsel(v > m, v, m);
  }
  if (j < n) {
    vf v = load_part(x + j, n - j, -INFINITY);
    nan |= v != v;
    m = vsel(v > m, v, m);
  }
  float t[VW], r = -INFINITY;
  ST(t, m);
  int32_t ni[VW];
  memcpy(ni, &nan, sizeof ni);
  for (int i = 0; i < VW; i++) {
    if (ni[i]) return NAN;
    if (t[i] > r) r = t[i];
  }
  return r;
}
#endif

static void scale(float *y, int n, float a) {
  int j = 0;
  for (; j + VW <= n; j += VW) ST(y + j, LD(y + j) * a);
  for (; j < n; j++) y[j] *= a;
}

static void dt_row(float *dP, const float *P, int n, float D) {
  int j = 0;
  for (; j + VW <= n; j += VW) {
    vf p = LD(P + j);
    ST(dP + j, vsel(p == splat(0), splat(0), p * (LD(dP + j) - D)));
  }
  for (; j < n; j++) dP[j] = P[j] == 0 ? 0.0f : P[j] * (dP[j] - D);
}

/* ---- 16-bit conversions ---------------------------------------------------------- */

typedef uint16_t vh __attribute__((vector_size(VW * 2), aligned(2), may_alias));
typedef uint32_t vu __attribute__((vector_size(VW * 4)));

static float half_to_float(uint16_t h) {
  uint32_t s = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, bits;
  if (e == 0x1f) bits = s | 0x7f800000u | (m << 13);
  else if (e) bits = s | ((e + 112) << 23) | (m << 13);
  else if (!m) bits = s;
  else { /* subnormal: m * 2^-24 */
    float f = (float)m * 5.9604644775390625e-8f;
    return s ? -f : f;
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

/* bf16: a shift; fp16: vcvtph2ps where the table has F16C (VW >= 8). */
static void from16(float *dst, const uint16_t *src, int n, bool bf16) {
  int j = 0;
  if (bf16) {
    for (; j + VW <= n; j += VW) ST(dst + j, (vf)(__builtin_convertvector(*(const vh *)(src + j), vu) << 16));
    for (; j < n; j++) {
      uint32_t b = (uint32_t)src[j] << 16;
      memcpy(dst + j, &b, 4);
    }
    return;
  }
#if VW >= 8
  for (; j + 8 <= n; j += 8)
    _mm256_storeu_ps(dst + j, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + j))));
#endif
  for (; j < n; j++) dst[j] = half_to_float(src[j]);
}

/* Rounded to nearest even, as rt_bf16_from_double and rt_half_from_double
 * of the same fp32 values (a NaN stays a NaN). */
static void to16(uint16_t *dst, const float *src, int n, float mul, bool bf16) {
  int j = 0;
  if (bf16) {
    for (; j + VW <= n; j += VW) {
      vf x = LD(src + j) * mul;
      vu b = (vu)x, nan = (vu)(x != x);
      vu r = (b + 0x7fff + ((b >> 16) & 1)) >> 16;
      *(vh *)(dst + j) = __builtin_convertvector((r & ~nan) | (nan & 0x7fc0), vh);
    }
    for (; j < n; j++) dst[j] = rt_bf16_from_double((double)(src[j] * mul));
    return;
  }
#if VW >= 8
  for (; j + 8 <= n; j += 8)
    _mm_storeu_si128((__m128i *)(dst + j),
                     _mm256_cvtps_ph(_mm256_mul_ps(_mm256_loadu_ps(src + j), _mm256_set1_ps(mul)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
  for (; j < n; j++) dst[j] = rt_half_from_double((double)(src[j] * mul));
}

/* ---- tanh, the JIT's ----------------------------------------------------------------
 *
 * The JIT lowers tanh to a call of cpu_tanhf_<width> that names
 * cpu_tanh_v4/v8/v16 (KERN_VMATH below) as its vector variants
 * (cpu/ir_llvm.c), so the loop vectoriser calls one on VW lanes at a time:
 * the one place the function is written. Below |x| 0.625 Cephes tanhf's odd polynomial; above it
 * 1 - 2 / (e^2|x| + 1), e^y built from y = n ln2 + r as q 2^n + (2^n + 1)
 * with q = e^r - 1 a degree-4 polynomial in r plus r + r^2 (Chebyshev
 * interpolation, float coefficients: 0.18 ulp of e^r; tanh's error is at
 * most 0.62 of e's there). y is clamped to 88 (e^88 is finite and 2 /
 * (e^88 + 1) already rounds 1 - it to 1), so 2^n is one exponent insertion
 * (0 <= n <= 127) and a NaN passes through the arithmetic; the sign is
 * restored last (tanh(-0) = -0). A vector whose lanes are all below 0.625
 * (a softcap's usual scores) takes the polynomial alone. Every multiply-add
 * is one rounding (vfma), so each width and the scalar function give the
 * same bits. */
#if VW == 16
static inline vf vfma(vf a, vf b, vf c) { return (vf)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c); }
static inline bool all_lt(vf a, float b) {
  return _mm512_cmp_ps_mask((__m512)a, _mm512_set1_ps(b), _CMP_LT_OQ) == 0xffff;
}
#elif VW == 8
static inline vf vfma(vf a, vf b, vf c) { return (vf)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c); }
static inline bool all_lt(vf a, float b) {
  return _mm256_movemask_ps(_mm256_cmp_ps((__m256)a, _mm256_set1_ps(b), _CMP_LT_OQ)) == 0xff;
}
#else
static inline vf vfma(vf a, vf b, vf c) {
  for (int i = 0; i < VW; i++) a[i] = fmaf(a[i], b[i], c[i]);
  return a;
}
static inline bool all_lt(vf a, float b) {
  for (int i = 0; i < VW; i++)
    if (!(a[i] < b)) return false;
  return true;
}
#endif

static inline vf vhorner(vf x, const float *c, int n) {
  vf y = splat(c[0]);
  for (int i = 1; i < n; i++) y = vfma(y, x, splat(c[i]));
  return y;
}

static inline vf vtanh(vf x) {
  static const float P[] = {-5.70498872745E-3f, 2.06390887954E-2f, -5.37397155531E-2f,
                            1.33314422036E-1f, -3.33332819422E-1f};
  static const float E[] = {1.3926932588219643E-3f, 8.363778702914715E-3f, 4.166654869914055E-2f,
                            1.6666573286056519E-1f, 0.5f};
  const vi sign = (vi)splat(-0.0f);
  vf ax = (vf)((vi)x & ~sign);
  vf z = x * x;
  vf t = vfma(x * z, vhorner(z, P, 5), x);
  if (!all_lt(ax, 0.625f)) {
    vf y = ax + ax;
    y = vsel(y > splat(88.0f), splat(88.0f), y);
    /* n = round(y log2 e) by adding 1.5 * 2^23: the sum's low mantissa bits
     * are n, so 2^n is those bits shifted into the exponent */
    vf mg = vfma(y, splat(1.44269504088896341f), splat(12582912.0f));
    vf nf = mg - 12582912.0f;
    vf r = vfma(nf, splat(-0.693359375f), y);
    r = vfma(nf, splat(2.12194440e-4f), r);
    vf q = vfma(vhorner(r, E, 5), r * r, r); /* e^r - 1 */
    vf p2 = (vf)(((vi)mg << 23) + 0x3f800000);
    /* e^y + 1 = q 2^n + (2^n + 1), one rounding (2^n + 1 is exact for
     * n <= 23; above, the 1 is below an ulp of the result anyway) */
    vf e1 = vfma(q, p2, p2 + 1.0f);
    t = vsel(ax < splat(0.625f), t, 1.0f - 2.0f / e1);
  }
  /* the sign last, for both sides: the polynomial's x + x z P(z) makes -0 +0 */
  return (vf)(((vi)t & ~sign) | ((vi)x & sign));
}

/* ---- sin and cos, the JIT's ----------------------------------------------------------
 *
 * In double precision, rounded to float once: x is exact as a double; n =
 * round(x 2/pi) by adding and subtracting 1.5 * 2^52 (the sum's low bits
 * are n's, which give the quadrant); r = x - n pi/2 with
 * pi/2 in two doubles (fdlibm's split: n times the first is exact for |n| <
 * 2^20); sin r and cos r by their Taylor polynomials on |r| <= pi/4 (to
 * r^13 and r^12: 3e-14 and 6e-13 relative), the quadrant from n (cos x is
 * sin of quadrant n + 1). So the float result is within 0.5 ulp and a hair
 * of the truth, where libmvec's sinf reached 2.1 ulp. A lane with |x| >=
 * 2^20, or infinite, or NaN goes to libm's sinf / cosf on its own. */
typedef double vdd __attribute__((vector_size(VW * 8)));
typedef uint64_t vull __attribute__((vector_size(VW * 8)));

/* The lanes of x at or past 2^20, infinite or NaN, by libm's sinf / cosf
 * one at a time (kept out of line: the vector path has no room for it). */
static __attribute__((noinline, cold)) vf sincos_libm(vf x, vf y, bool cosine) {
  for (int i = 0; i < VW; i++)
    if (!(fabsf(x[i]) < 1048576.0f)) y[i] = cosine ? cosf(x[i]) : sinf(x[i]);
  return y;
}

static inline __attribute__((always_inline)) vf vsincos(vf x, bool cosine) {
  vdd d = __builtin_convertvector(x, vdd);
  /* nm's low mantissa bits are n (two's complement, n mod 4 is all we use) */
  vdd nm = d * 0.63661977236758134308 + 0x1.8p52, nd = nm - 0x1.8p52;
  vdd r = (d - nd * 1.57079632673412561417e+00) - nd * 6.07710050650619224932e-11;
  vdd z = r * r;
  vdd sn = r + r * z * (-1.0 / 6 + z * (1.0 / 120 + z * (-1.0 / 5040 + z * (1.0 / 362880 +
                        z * (-1.0 / 39916800 + z * (1.0 / 6227020800.0))))));
  vdd cs = 1.0 - 0.5 * z + z * z * (1.0 / 24 + z * (-1.0 / 720 + z * (1.0 / 40320 +
                                    z * (-1.0 / 3628800 + z * (1.0 / 479001600)))));
  /* masks by arithmetic, not comparisons (GCC takes a compare of 16 int64
   * lanes apart lane by lane) */
  vull uq = (vull)nm + (cosine ? 1 : 0), odd = -(uq & 1);
  vdd v = (vdd)((odd & (vull)cs) | (~odd & (vull)sn));
  v = (vdd)((vull)v ^ ((uq & 2) << 62)); /* the sign flipped in quadrants 2, 3 */
  vf y = __builtin_convertvector(v, vf);
  if (!cosine) y = vsel(x == splat(0.0f), x, y); /* sin(-0) = -0 */
  vf ax = (vf)((vi)x & ~(vi)splat(-0.0f));
  return all_lt(ax, 1048576.0f) ? y : sincos_libm(x, y, cosine); /* also inf, NaN */
}

/* ---- erf, the JIT's ----------------------------------------------------------------
 *
 * In double precision too, rounded to float once. |x| <= 1: erf's Taylor
 * series to x^29 (3e-14 relative); a vector with no lane past 1 stops
 * there. Above: erf = 1 - e^-x^2 R(x), R(x) = erfc(x) e^x^2 a degree-14
 * Chebyshev interpolant on [1, 3.9] (1.4e-10 relative, of an erfc below
 * 0.16), evaluated by Clenshaw's recurrence, and e^-x^2 by a double exp
 * (n = round(y log2 e), r = y - n ln2 in two parts, Taylor to r^11:
 * 6e-15). Past 3.9 the float result is 1; the sign is x's (erf(-0) = -0);
 * a NaN passes through. libmvec's erff measured 2.3 to 4 ulp. */
/* *v = e^*v for -15.3 <= *v <= -1 (through a pointer: a vdd wider than the
 * ISA's vectors is no value to pass around) */
static inline __attribute__((always_inline)) void dexp_neg(vdd *v) {
  vdd y = *v;
  vdd nm = y * 1.4426950408889634 + 0x1.8p52, n = nm - 0x1.8p52;
  vdd r = (y - n * 6.93147180369123816490e-01) - n * 1.90821492927058770002e-10;
  vdd e = 1.0 + r * (1.0 + r * (1.0 / 2 + r * (1.0 / 6 + r * (1.0 / 24 + r * (1.0 / 120 +
          r * (1.0 / 720 + r * (1.0 / 5040 + r * (1.0 / 40320 + r * (1.0 / 362880 +
          r * (1.0 / 3628800 + r * (1.0 / 39916800)))))))))));
  vull bits = ((vull)nm - (vull)((vdd){0} + 0x1.8p52) + 1023) << 52; /* 2^n */
  *v = e * (vdd)bits;
}

static inline __attribute__((always_inline)) vf verf(vf x) {
  static const double T[15] = {
      1.1283791670955126,     -0.37612638903183754,   0.11283791670955126,
      -0.026866170645131252,  0.005223977625442188,   -0.0008548327023450852,
      0.00012055332981789664, -1.492565035840625e-05, 1.6462114365889246e-06,
      -1.6365844691234924e-07, 1.4807192815879218e-08, -1.2290555301717926e-09,
      9.422759064650411e-11,  -6.7113668551641105e-12, 4.4632242632864775e-13};
  static const double CH[15] = {
      0.24729849699550102,    -0.134740805627286,     0.0345858179700903,
      -0.008433346742071716,  0.0019654756748025506,  -0.00043991979591861757,
      9.492434305635177e-05,  -1.980801615345899e-05, 4.007749994855425e-06,
      -7.879909949456051e-07, 1.5084547023613027e-07, -2.8161416427511614e-08,
      5.134656840451631e-09,  -9.148180638944107e-10, 1.552445052140546e-10};
  const vi sign = (vi)splat(-0.0f);
  vf ax = (vf)((vi)x & ~sign);
  vdd a = __builtin_convertvector(ax, vdd), z = a * a;
  vdd p = (vdd){0} + T[14];
  for (int i = 13; i >= 0; i--) p = p * z + T[i];
  vf y = __builtin_convertvector(a * p, vf);
  if (!all_lt(ax, 1.0f)) {
    vdd t = (a - 2.45) * (1.0 / 1.45), t2 = t + t, b1 = (vdd){0}, b2 = (vdd){0};
    for (int k = 14; k >= 1; k--) {
      vdd b0 = t2 * b1 - b2 + CH[k];
      b2 = b1, b1 = b0;
    }
    vdd rr = t * b1 - b2 + CH[0];
    /* e^-x^2 of x clamped to [1, 3.9], where the tail is used */
    vf axc = vsel(ax < splat(3.9f), vsel(ax > splat(1.0f), ax, splat(1.0f)), splat(3.9f));
    vdd ac = __builtin_convertvector(axc, vdd);
    vdd e = -(ac * ac);
    dexp_neg(&e);
    vf tail = __builtin_convertvector(1.0 - e * rr, vf);
    y = vsel(ax > splat(1.0f), tail, y);          /* a NaN keeps the series' NaN */
    y = vsel(ax >= splat(3.9f), splat(1.0f), y);  /* also +inf */
  }
  return (vf)(((vi)y & ~sign) | ((vi)x & sign));
}

#ifdef KERN_VMATH_W /* the one definition of each width (kern_generic.c, _avx2.c, _avx512.c) */
#define KERN_CAT_(a, b) a##b
#define KERN_CAT(a, b) KERN_CAT_(a, b)
/* cpu_<f>_v<VW>: the vector variants; cpu_<f>f_<VW>: the scalar function of
 * a JIT whose widest vector is VW, lane 0 of that width, so that a row's
 * remainder gets its vector lanes' bits */
#define KERN_VMATH(f, body)                                                                   \
  vf KERN_CAT(cpu_##f##_v, KERN_VMATH_W)(vf x);                                                \
  vf KERN_CAT(cpu_##f##_v, KERN_VMATH_W)(vf x) { return body; }                                \
  static float KERN_CAT(scalar_##f, KERN_VMATH_W)(float s) { return KERN_CAT(cpu_##f##_v, KERN_VMATH_W)(splat(s))[0]; }
KERN_VMATH(tanh, vtanh(x))
KERN_VMATH(sin, vsincos(x, false))
KERN_VMATH(cos, vsincos(x, true))
KERN_VMATH(erf, verf(x))
#define KERN_VMATH_FNS(f) (void (*)(void))KERN_CAT(cpu_##f##_v, KERN_VMATH_W)
const CpuVmath KERN_CAT(cpu_vmath_, KERN_VMATH_W) = {
    VW,
    {KERN_VMATH_FNS(tanh), KERN_VMATH_FNS(sin), KERN_VMATH_FNS(cos), KERN_VMATH_FNS(erf)},
    {KERN_CAT(scalar_tanh, KERN_VMATH_W), KERN_CAT(scalar_sin, KERN_VMATH_W),
     KERN_CAT(scalar_cos, KERN_VMATH_W), KERN_CAT(scalar_erf, KERN_VMATH_W)}};
#endif

#ifdef KERN_BF16
/* ---- bf16 products (AVX512-BF16) ---------------------------------------------------
 *
 * vdpbf16ps multiplies pairs of bf16 and adds both products into one fp32
 * lane: c[i] += a[2i] b[2i] + a[2i+1] b[2i+1] (products exact, the sum in
 * fp32, denormals flushed). So the operands are read as 32-bit words, each a
 * pair of bf16 along k: a word of A is (A[r][2p], A[r][2p+1]), a bf16 row
 * as stored (k contiguous), broadcast to every lane; a word of B is
 * (B[2p][j], B[2p+1][j]), two rows of B interleaved, loaded 16 columns at a
 * time. One instruction does twice the multiply-adds of an fp32 FMA. */
#include <immintrin.h>

static inline __attribute__((always_inline)) void block_bf16(const int mr, int k2,
                                                              const uint32_t *A, int64_t lda,
                                                              const uint32_t *B, int64_t ldb,
                                                              float *C, int64_t ldc, float alpha,
                                                              bool acc) {
  __m512 c0[MR], c1[MR];
#pragma GCC unroll 16
  for (int r = 0; r < mr; r++) c0[r] = c1[r] = _mm512_setzero_ps();
  for (int p = 0; p < k2; p++) {
    __m512bh b0 = (__m512bh)_mm512_loadu_si512(B + p * ldb);
    __m512bh b1 = (__m512bh)_mm512_loadu_si512(B + p * ldb + 16);
#pragma GCC unroll 16
    for (int r = 0; r < mr; r++) {
      __m512bh a = (__m512bh)_mm512_set1_epi32((int)A[r * lda + p]);
      c0[r] = _mm512_dpbf16_ps(c0[r], a, b0);
      c1[r] = _mm512_dpbf16_ps(c1[r], a, b1);
    }
  }
  __m512 al = _mm512_set1_ps(alpha);
#pragma GCC unroll 16
  for (int r = 0; r < mr; r++) {
    float *c = C + r * ldc;
    __m512 x0 = _mm512_mul_ps(c0[r], al), x1 = _mm512_mul_ps(c1[r], al);
    if (acc) x0 = _mm512_add_ps(x0, _mm512_loadu_ps(c)), x1 = _mm512_add_ps(x1, _mm512_loadu_ps(c + 16));
    _mm512_storeu_ps(c, x0);
    _mm512_storeu_ps(c + 16, x1);
  }
}

static void tail_bf16(int mr, int k2, const uint32_t *A, int64_t lda, const uint32_t *B,
                      int64_t ldb, float *C, int64_t ldc, float alpha, bool acc) {
  switch (mr) {
#define ROWS(R) case R: block_bf16(R, k2, A, lda, B, ldb, C, ldc, alpha, acc); break;
  ROWS(1) ROWS(2) ROWS(3) ROWS(4) ROWS(5) ROWS(6) ROWS(7)
#undef ROWS
  default: break;
  }
}

static void gemm_bf16(int m, int n, int k2, const uint32_t *A, int64_t lda, const uint32_t *B,
                      int64_t ldb, float *C, int64_t ldc, float alpha, bool acc) {
  for (int j = 0; j < n; j += 32) {
    int i = 0;
    for (; i + MR <= m; i += MR)
      block_bf16(MR, k2, A + i * lda, lda, B + j, ldb, C + i * ldc + j, ldc, alpha, acc);
    if (i < m) tail_bf16(m - i, k2, A + i * lda, lda, B + j, ldb, C + i * ldc + j, ldc, alpha, acc);
  }
}

/* e^(x - mx) for a bf16 P, from t = x log2(e) - mx log2(e) (one FMA; mxl is
 * mx log2(e)): 2^t = 2^f 2^n with n = round(t), f = t - n in [-1/2, 1/2]
 * (exact), 2^f a degree-5 polynomial (Chebyshev interpolation, float
 * coefficients: 1.6e-7 relative) and 2^n by vscalefps. The rounding of
 * mxl shifts every t of a row alike (by at most |mx| 2^-24 log2(e)), a
 * common factor that P V / l cancels; the caller keeps |mx| < 2^16, so
 * the shift is below 3e-3 and the LSE's error below 2e-3 of 2^16. P is
 * rounded to bf16 (2^-9) right after, so this costs P nothing that bf16
 * does not. t is clamped below at -151 (2^-151 rounds to 0) so that a
 * -inf key gives 0, not inf - inf; a NaN passes (vmaxps keeps its second
 * operand). x - mx <= 0 here (mx is the row's max), so there is no upper
 * clamp: mx = +inf gives 0 for finite x and NaN for x = +inf, as vexp. */
static inline vf vexp2_p(vf x, __m512 mxl) {
  __m512 t = _mm512_fmsub_ps((__m512)x, _mm512_set1_ps(1.44269504088896341f), mxl);
  t = _mm512_max_ps(_mm512_set1_ps(-151.0f), t);
  __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 f = _mm512_sub_ps(t, n);
  __m512 y = _mm512_set1_ps(1.3390863314270973e-3f);
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(9.676031768321991e-3f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(5.5503569543361664e-2f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(2.402210682630539e-1f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(6.931471824645996e-1f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.0000001192092896f));
  return (vf)_mm512_scalef_ps(y, n);
}

/* e^(x - mx) for a row: vexp2_p where |mx| < 2^16, else vexp (a row max
 * past 2^16, or infinite: accurate, and rare). */
static inline vf p_exp(vf x, float mx, __m512 mxl, bool fast) {
  return fast ? vexp2_p(x, mxl) : vexp(x - mx);
}

/* The 16 fp32 values of the low (lo) or high (hi) half of 32 bf16. */
static inline vf bf16_lo(__m512bh p) {
  return (vf)_mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256((__m512i)p)), 16));
}
static inline vf bf16_hi(__m512bh p) {
  return (vf)_mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64((__m512i)p, 1)), 16));
}

/* The forward's bf16 P straight from S: e^(x - mx) by p_exp rounded to
 * bf16 into dst (no fp32 P), and the sum of those rounded values (l), so
 * the weights P / l that O is made of sum to 1 as stored. A part row of
 * 32 reads -inf where there is no key (e^-inf = 0, which is also the
 * pad). */
static float exp_sum_bf16(uint16_t *dst, const float *x, int n, float mx) {
  bool fast = fabsf(mx) < 0x1p16f;
  __m512 mxl = _mm512_set1_ps(fast ? mx * 1.44269504088896341f : 0.0f);
  vf s = splat(0);
  int j = 0;
  for (; j + 32 <= n; j += 32) {
    vf e0 = p_exp(LD(x + j), mx, mxl, fast), e1 = p_exp(LD(x + j + 16), mx, mxl, fast);
    __m512bh pb = _mm512_cvtne2ps_pbh((__m512)e1, (__m512)e0);
    s += bf16_lo(pb);
    s += bf16_hi(pb);
    _mm512_storeu_si512(dst + j, (__m512i)pb);
  }
  if (j < n) {
    int left = n - j, pad = left + (left & 1);
    __mmask16 lo = (__mmask16)(left >= 16 ? 0xffff : (1u << left) - 1);
    __mmask16 hi = (__mmask16)(left <= 16 ? 0 : (1u << (left - 16)) - 1);
    __m512 ninf = _mm512_set1_ps(-INFINITY);
    vf e0 = p_exp((vf)_mm512_mask_loadu_ps(ninf, lo, x + j), mx, mxl, fast);
    vf e1 = p_exp((vf)_mm512_mask_loadu_ps(ninf, hi, x + j + 16), mx, mxl, fast);
    __m512bh pb = _mm512_cvtne2ps_pbh((__m512)e1, (__m512)e0);
    s += bf16_lo(pb); /* the pad and the keys past n are 0 */
    s += bf16_hi(pb);
    __mmask32 st = pad >= 32 ? 0xffffffffu : (__mmask32)((1u << pad) - 1);
    _mm512_mask_storeu_epi16(dst + j, st, (__m512i)pb);
  }
  return hsum(s);
}
#define KERN_BF16_FNS gemm_bf16, exp_sum_bf16
#else
#define KERN_BF16_FNS NULL, NULL
#endif

const CpuKern KERN_TABLE = {KERN_NAME, NR,     gemm, exp_sum, exp_sub, row_max, scale,
                            dt_row,    from16, to16, KERN_BF16_FNS};
