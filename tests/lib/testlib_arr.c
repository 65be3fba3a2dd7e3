/* testlib_arr.c: host arrays, float64 twins and the relative norm error
 * that the numerical suites compare backends with. */
#include <math.h>

#include "testlib.h"

const TlDtype tl_dtypes[3] = {{"fp32", kDLFloat, 32, 1e-4, 1e-3},
                              {"fp16", kDLFloat, 16, 5e-3, 2e-2},
                              {"bf16", kDLBfloat, 16, 3e-2, 6e-2}};

void tl_arr_init(TlArr *x, DLDataType dt, int nd, const int64_t *shape) {
  rt_array_init(&x->a, dt, nd, shape);
  x->t = rt_array_tensor(&x->a);
}

void tl_arr_free(TlArr *x) { rt_array_free(&x->a); }

void tl_arr_poison(TlArr *x) {
  for (int64_t i = 0; i < rt_array_count(&x->a); i++) rt_array_set(&x->a, i, NAN);
}

void tl_arr_normal(TlArr *x, uint64_t *rng) {
  for (int64_t i = 0; i < rt_array_count(&x->a); i++) rt_array_set(&x->a, i, tl_normal(rng));
}

void tl_arr_uniform(TlArr *x, double lo, double hi, uint64_t *rng) {
  for (int64_t i = 0; i < rt_array_count(&x->a); i++)
    rt_array_set(&x->a, i, lo + (hi - lo) * tl_uniform(rng));
}

/* The one error loop. inf_exact: equal infinities are skipped as exact
 * (without it, inf - inf poisons the sum with NaN, which never passes). */
static double norm_err(const RtArray *x, const RtArray *ref, bool inf_exact) {
  /* Arrays of different shapes are a broken test, not a small error. */
  bool same = x->ndim == ref->ndim && rt_array_count(x) == rt_array_count(ref);
  for (int d = 0; same && d < x->ndim; d++) same = x->shape[d] == ref->shape[d];
  if (!same) return INFINITY;
  double num = 0, den = 0;
  for (int64_t i = 0; i < rt_array_count(x); i++) {
    double a = rt_array_get(x, i), b = rt_array_get(ref, i);
    if (isnan(a) || isnan(b)) return INFINITY;
    if (inf_exact && isinf(b) && a == b) continue;
    num += (a - b) * (a - b), den += b * b;
  }
  double e = den > 0 ? sqrt(num / den) : INFINITY; /* an all-zero reference proves nothing */
  return isnan(e) ? INFINITY : e; /* an infinity against a finite value */
}

double tl_rel_err(const RtArray *x, const RtArray *ref) { return norm_err(x, ref, true); }

void tl_array_copy(RtArray *dst, const RtArray *src) {
  rt_array_init(dst, src->dtype, src->ndim, src->shape);
  for (int64_t k = 0; k < rt_array_count(src); k++) rt_array_set(dst, k, rt_array_get(src, k));
}

double tl_rel_moved(const RtArray *a, const RtArray *b) {
  double d = 0, r = 0;
  for (int64_t k = 0; k < rt_array_count(b) && k < rt_array_count(a); k++) {
    double x = rt_array_get(a, k), y = rt_array_get(b, k);
    if (isfinite(x) && isfinite(y)) d += (x - y) * (x - y), r += y * y;
  }
  return r > 0 ? sqrt(d / r) : 0;
}

void tl_pair_init(TlPair *p, DLDataType dt, int nd, const int64_t *shape, bool fill,
                  uint64_t *rng) {
  rt_array_init(&p->x, dt, nd, shape);
  rt_array_init(&p->ref, rt_dtype(kDLFloat, 64), nd, shape);
  for (int64_t i = 0; i < rt_array_count(&p->x); i++) {
    rt_array_set(&p->x, i, fill ? tl_normal(rng) : NAN);
    if (fill) rt_array_set(&p->ref, i, rt_array_get(&p->x, i));
  }
  p->tx = rt_array_tensor(&p->x), p->tref = rt_array_tensor(&p->ref);
}

void tl_pair_free(TlPair *p) {
  rt_array_free(&p->x);
  rt_array_free(&p->ref);
}

double tl_pair_err(const TlPair *p) { return norm_err(&p->x, &p->ref, false); }
