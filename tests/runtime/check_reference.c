/* The float64 reference backend: its backward against central finite
 * differences of L = sum(O * dO) + sum(LSE * dLSE) for every sample kernel,
 * its forward against a naive attention written here, fully masked rows,
 * and checked-run failures. Fresh random inputs every run. */
#include <check.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/npy.h"
#include "runtime/rt.h"
#include "testlib.h"

#define MAXB 8

static double *D(TlArr *x) { return x->a.data; }
static int64_t N(const TlArr *x) { return rt_array_count(&x->a); }

/* Shapes of one case. */
typedef struct Dims {
  int B, H, HKV, QL, KL, E, EV;
} Dims;

/* One attention call with everything it reads and writes, all float64. */
typedef struct Case {
  flex_kernel *k;
  Dims d;
  TlArr q, k_, v, out, lse, dout, dlse, dq, dk, dv;
  TlArr bufs[MAXB], grads[MAXB];
  flex_buffer fb[MAXB];
  flex_param params[MAXB];
  flex_args args;
  uint64_t seed;
} Case;

static const DLDataType F64 = {kDLFloat, 64, 1};

/* Random but valid buffers: float values on a 2^-10 grid (so binary32
 * perturbations are exact), sorted ids, int values in [0, KV_LEN]. */
static void make_buffer(Case *c, int j) {
  const IrBuffer *ib = &c->k->mod->buffers[j];
  int64_t shape[IR_MAXDIMS];
  int32_t pre[SZ_COUNT] = {c->d.B, c->d.H, c->d.HKV, c->d.QL, c->d.KL};
  int free_size = c->d.QL > c->d.KL ? c->d.QL : c->d.KL;
  for (int d = 0; d < ib->ndims; d++)
    shape[d] = ib->dims[d].fixed >= 0 ? ib->dims[d].fixed
             : ib->dims[d].size < SZ_COUNT ? pre[ib->dims[d].size] : free_size;
  static const uint8_t codes[] = {kDLFloat, kDLFloat, kDLBfloat, kDLInt, kDLInt, kDLUInt, kDLBool};
  static const uint8_t bits[] = {32, 16, 16, 32, 64, 8, 8};
  tl_arr_init(&c->bufs[j], rt_dtype(codes[ib->dtype], bits[ib->dtype]), ib->ndims, shape);
  int64_t n = N(&c->bufs[j]), id = 0;
  for (int64_t i = 0; i < n; i++) {
    double x;
    if (ib->dtype == DT_F32 || ib->dtype == DT_F16 || ib->dtype == DT_BF16)
      x = ldexp(round(ldexp(tl_uniform(&c->seed) * 1.6 - 0.8, 8)), -8);
    else if (ib->sorted) x = (double)(id += tl_uniform(&c->seed) < 0.2);
    else if (ib->dtype == DT_BOOL) x = (double)(tl_rand(&c->seed) & 1);
    else x = (double)(tl_rand(&c->seed) % (uint64_t)(c->d.KL + 1));
    rt_array_set(&c->bufs[j].a, i, x);
  }
  c->fb[j].name = ib->id;
  c->fb[j].tensor = &c->bufs[j].t;
  if (ib->grad) {
    tl_arr_init(&c->grads[j], F64, ib->ndims, shape);
    c->fb[j].grad = &c->grads[j].t;
  }
}

static void case_init(Case *c, flex_kernel *k, Dims d, uint64_t seed) {
  memset(c, 0, sizeof *c);
  c->k = k;
  c->d = d;
  c->seed = seed;
  int64_t q[4] = {d.B, d.H, d.QL, d.E}, kk[4] = {d.B, d.HKV, d.KL, d.E};
  int64_t v[4] = {d.B, d.HKV, d.KL, d.EV}, o[4] = {d.B, d.H, d.QL, d.EV};
  tl_arr_init(&c->q, F64, 4, q), tl_arr_init(&c->dq, F64, 4, q);
  tl_arr_init(&c->k_, F64, 4, kk), tl_arr_init(&c->dk, F64, 4, kk);
  tl_arr_init(&c->v, F64, 4, v), tl_arr_init(&c->dv, F64, 4, v);
  tl_arr_init(&c->out, F64, 4, o), tl_arr_init(&c->dout, F64, 4, o);
  tl_arr_init(&c->lse, F64, 3, o), tl_arr_init(&c->dlse, F64, 3, o);
  tl_arr_normal(&c->q, &c->seed), tl_arr_normal(&c->k_, &c->seed);
  tl_arr_normal(&c->v, &c->seed), tl_arr_normal(&c->dout, &c->seed);
  tl_arr_normal(&c->dlse, &c->seed);
  const IrModule *m = k->mod;
  CHECK(m->nbuffers <= MAXB && m->nparams <= MAXB);
  for (int j = 0; j < m->nbuffers; j++) make_buffer(c, j);
  for (int j = 0; j < m->nparams; j++) {
    c->params[j].name = m->params[j].id;
    c->params[j].value = m->params[j].type == IT_I32 ? (double)(1 + tl_rand(&c->seed) % 8)
                                                     : 2 + 4 * tl_uniform(&c->seed);
  }
  flex_args *a = &c->args;
  a->backend = FLEX_BACKEND_REFERENCE;
  a->q = &c->q.t, a->k = &c->k_.t, a->v = &c->v.t, a->out = &c->out.t, a->lse = &c->lse.t;
  a->dout = &c->dout.t, a->dlse = &c->dlse.t, a->dq = &c->dq.t, a->dk = &c->dk.t, a->dv = &c->dv.t;
  a->params = c->params, a->nparams = m->nparams;
  a->buffers = c->fb, a->nbuffers = m->nbuffers;
  a->check_bounds = true;
  a->scale = tl_uniform(&c->seed) < 0.5 ? 0 : 0.2 + 0.3 * tl_uniform(&c->seed);
}

static void case_free(Case *c) {
  TlArr *all[] = {&c->q, &c->k_, &c->v, &c->out, &c->lse, &c->dout, &c->dlse, &c->dq, &c->dk, &c->dv};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tl_arr_free(all[i]);
  for (int j = 0; j < MAXB; j++) {
    tl_arr_free(&c->bufs[j]);
    tl_arr_free(&c->grads[j]);
  }
}

static void forward(Case *c) {
  tl_arr_poison(&c->out), tl_arr_poison(&c->lse);
  ck_assert_msg(flex_forward(c->k, &c->args) == FLEX_OK, "forward: %s", flex_last_error());
}

static void backward(Case *c) {
  forward(c);
  tl_arr_poison(&c->dq), tl_arr_poison(&c->dk), tl_arr_poison(&c->dv);
  for (int j = 0; j < MAXB; j++)
    if (c->grads[j].a.data) tl_arr_poison(&c->grads[j]);
  ck_assert_msg(flex_backward(c->k, &c->args) == FLEX_OK, "backward: %s", flex_last_error());
}

/* L = sum(O dO) + sum(LSE dLSE) over rows that are not fully masked (there
 * LSE is the constant -inf). */
static double loss(Case *c) {
  forward(c);
  double L = 0;
  for (int64_t i = 0; i < N(&c->out); i++) L += D(&c->out)[i] * D(&c->dout)[i];
  for (int64_t i = 0; i < N(&c->lse); i++)
    if (isfinite(D(&c->lse)[i])) L += D(&c->lse)[i] * D(&c->dlse)[i];
  return L;
}

/* Directional derivative of L along u (x is perturbed in place, float64 or
 * float32 storage), Richardson-extrapolated central differences. */
static double fd_along(Case *c, TlArr *x, const double *u, double h) {
  int64_t n = N(x);
  double *x0 = base_alloc(sizeof(double) * (size_t)(n ? n : 1)), d[2];
  for (int64_t i = 0; i < n; i++) x0[i] = rt_array_get(&x->a, i);
  for (int k = 0; k < 2; k++, h /= 2) {
    double l[2];
    for (int sgn = 0; sgn < 2; sgn++) {
      for (int64_t i = 0; i < n; i++) rt_array_set(&x->a, i, x0[i] + (sgn ? -h : h) * u[i]);
      l[sgn] = loss(c);
    }
    d[k] = (l[0] - l[1]) / (2 * h);
  }
  for (int64_t i = 0; i < n; i++) rt_array_set(&x->a, i, x0[i]);
  base_free(x0);
  return (4 * d[1] - d[0]) / 3;
}

/* Check gradient g of L w.r.t. x: along a direction leaning on g (so the
 * projection is far from zero) and at the element of largest |g|. Float32
 * inputs use signs and power-of-two steps, exact on their 2^-8 grid. */
static void check_grad(Case *c, const char *name, TlArr *x, TlArr *g, bool f32) {
  int64_t n = N(x);
  if (!n) return;
  double *u = base_alloc(sizeof(double) * (size_t)n), gg = 0, dot = 0, gmax = 0;
  int64_t imax = 0;
  for (int64_t i = 0; i < n; i++) {
    ck_assert_msg(!isnan(D(g)[i]), "%s[%lld] is NaN", name, (long long)i);
    gg += D(g)[i] * D(g)[i];
    if (fabs(D(g)[i]) > gmax) gmax = fabs(D(g)[i]), imax = i;
  }
  double rms = sqrt(gg / (double)n);
  for (int64_t i = 0; i < n; i++) {
    u[i] = f32 ? (D(g)[i] > 0 ? 1.0 : D(g)[i] < 0 ? -1.0 : (tl_rand(&c->seed) & 1 ? 1.0 : -1.0))
               : D(g)[i] + (rms > 0 ? 0.5 * rms : 1.0) * tl_normal(&c->seed);
    dot += D(g)[i] * u[i];
  }
  double h = f32 ? ldexp(1, -7) : 1e-3;
  double fd = fd_along(c, x, u, h);
  if (gg == 0) {
    ck_assert_msg(fabs(fd) < 1e-9, "%s: gradient is 0 but finite differences give %g", name, fd);
  } else {
    double err = fabs(fd - dot) / fabs(dot);
    ck_assert_msg(err < 1e-6, "%s: directional derivative %.12g, finite differences %.12g (rel %.2e)",
                  name, dot, fd, err);
    memset(u, 0, sizeof(double) * (size_t)n);
    u[imax] = 1;
    fd = fd_along(c, x, u, h);
    err = fabs(fd - D(g)[imax]) / fabs(D(g)[imax]);
    ck_assert_msg(err < 1e-6, "%s[%lld]: %.12g, finite differences %.12g (rel %.2e)", name,
                  (long long)imax, D(g)[imax], fd, err);
  }
  base_free(u);
}

static void check_all_grads(Case *c, const char *what) {
  backward(c);
  char name[256];
  /* backward() poisoned the outputs before; copy the gradients out of the
   * way, since every finite difference reruns the forward. */
  TlArr gq, gk, gv, gb[MAXB];
  int64_t q[4], k[4], v[4];
  memcpy(q, c->dq.a.shape, sizeof q), memcpy(k, c->dk.a.shape, sizeof k), memcpy(v, c->dv.a.shape, sizeof v);
  tl_arr_init(&gq, F64, 4, q), tl_arr_init(&gk, F64, 4, k), tl_arr_init(&gv, F64, 4, v);
  memcpy(D(&gq), D(&c->dq), sizeof(double) * (size_t)N(&gq));
  memcpy(D(&gk), D(&c->dk), sizeof(double) * (size_t)N(&gk));
  memcpy(D(&gv), D(&c->dv), sizeof(double) * (size_t)N(&gv));
  snprintf(name, sizeof name, "%s: dq", what), check_grad(c, name, &c->q, &gq, false);
  snprintf(name, sizeof name, "%s: dk", what), check_grad(c, name, &c->k_, &gk, false);
  snprintf(name, sizeof name, "%s: dv", what), check_grad(c, name, &c->v, &gv, false);
  const IrModule *m = c->k->mod;
  for (int j = 0; j < m->nbuffers; j++) {
    if (!m->buffers[j].grad) continue;
    tl_arr_init(&gb[j], F64, c->grads[j].a.ndim, c->grads[j].a.shape);
    memcpy(D(&gb[j]), D(&c->grads[j]), sizeof(double) * (size_t)N(&gb[j]));
    snprintf(name, sizeof name, "%s: d_%s", what, m->buffers[j].id);
    check_grad(c, name, &c->bufs[j], &gb[j], true);
    tl_arr_free(&gb[j]);
  }
  tl_arr_free(&gq), tl_arr_free(&gk), tl_arr_free(&gv);
}

/* Odd shapes: head dim 15, Q_LEN 23 vs KV_LEN 56, EV != E, GQA; MQA with a
 * single query; a single key. */
static const Dims shapes[] = {
    {2, 4, 2, 23, 56, 15, 9},
    {1, 3, 1, 1, 17, 8, 8},
    {1, 2, 2, 9, 1, 4, 6},
};

START_TEST(samples_against_finite_differences) {
  uint64_t seed = tl_seed();
  DIR *dir = opendir(tl_src_path("samples"));
  ck_assert_ptr_nonnull(dir);
  struct dirent *e;
  int nfiles = 0;
  while ((e = readdir(dir))) {
    size_t len = strlen(e->d_name);
    if (len < 7 || strcmp(e->d_name + len - 6, ".score")) continue;
    char rel[512];
    snprintf(rel, sizeof rel, "samples/%s", e->d_name);
    flex_kernel *k;
    ck_assert_msg(flex_kernel_load(&k, tl_src_path(rel), NULL) == FLEX_OK, "%s: %s", rel,
                  flex_last_error());
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
      Case c;
      case_init(&c, k, shapes[s], seed++);
      char what[600];
      snprintf(what, sizeof what, "%s shape %zu", rel, s);
      check_all_grads(&c, what);
      case_free(&c);
    }
    flex_kernel_free(k);
    nfiles++;
  }
  closedir(dir);
  ck_assert_int_ge(nfiles, 9);
}
END_TEST

/* Every element of g against its own central difference (relative norm
 * error over the tensor). Float32 buffers step by 2^-7, exact on their grid. */
static double check_grad_elements(Case *c, const char *name, TlArr *x, const TlArr *g, bool f32) {
  int64_t n = N(x);
  double *u = base_alloc(sizeof(double) * (size_t)(n ? n : 1)), num = 0, den = 0;
  double h = f32 ? ldexp(1, -7) : 1e-3;
  for (int64_t i = 0; i < n; i++) {
    u[i] = 1;
    double fd = fd_along(c, x, u, h), gi = D((TlArr *)g)[i];
    u[i] = 0;
    ck_assert_msg(!isnan(gi) && !isnan(fd), "%s[%lld]: %g, finite differences %g", name,
                  (long long)i, gi, fd);
    num += (fd - gi) * (fd - gi), den += gi * gi;
  }
  base_free(u);
  if (den == 0) {
    ck_assert_msg(sqrt(num) < 1e-9, "%s: gradient is 0 but finite differences give norm %g",
                  name, sqrt(num));
    return 0;
  }
  double err = sqrt(num / den);
  ck_assert_msg(err < 1e-6, "%s: relative norm error %.2e against finite differences", name, err);
  return err;
}

/* A copy of gradient `g` that survives the forwards the differences rerun. */
static void keep(TlArr *dst, TlArr *g) {
  tl_arr_init(dst, F64, g->a.ndim, g->a.shape);
  memcpy(D(dst), D(g), sizeof(double) * (size_t)N(dst));
}

/* Every element of dq, dk, dv and each buffer gradient, at one tiny shape. */
static void check_every_element(Case *c, const char *what) {
  backward(c);
  TlArr gq, gk, gv, gb;
  keep(&gq, &c->dq), keep(&gk, &c->dk), keep(&gv, &c->dv);
  char name[700];
  double e[3 + MAXB] = {0};
  snprintf(name, sizeof name, "%s: dq", what), e[0] = check_grad_elements(c, name, &c->q, &gq, false);
  snprintf(name, sizeof name, "%s: dk", what), e[1] = check_grad_elements(c, name, &c->k_, &gk, false);
  snprintf(name, sizeof name, "%s: dv", what), e[2] = check_grad_elements(c, name, &c->v, &gv, false);
  const IrModule *m = c->k->mod;
  int ne = 3;
  for (int j = 0; j < m->nbuffers; j++) {
    if (!m->buffers[j].grad) continue;
    keep(&gb, &c->grads[j]);
    snprintf(name, sizeof name, "%s: d_%s", what, m->buffers[j].id);
    e[ne++] = check_grad_elements(c, name, &c->bufs[j], &gb, true);
    tl_arr_free(&gb);
  }
  fprintf(stderr, "  %s: every element: dq %.1e dk %.1e dv %.1e", what, e[0], e[1], e[2]);
  for (int i = 3; i < ne; i++) fprintf(stderr, " buffer %.1e", e[i]);
  fputc('\n', stderr);
  tl_arr_free(&gq), tl_arr_free(&gk), tl_arr_free(&gv);
}

/* Dropout (docs/language.md): the mask is a constant of the indices, so L stays
 * smooth and the gradients with dropout must match finite differences too,
 * at every element at a tiny shape (dq, dk, dv and relpos_bias's grad
 * buffer) and along directions at a GQA shape. */
START_TEST(dropout_against_finite_differences) {
  uint64_t seed = tl_seed();
  static const char *files[] = {"samples/causal.score", "samples/relpos_bias.score",
                                "samples/alibi.score"};
  const Dims tiny = {2, 2, 1, 5, 7, 3, 2};
  for (size_t f = 0; f < sizeof files / sizeof files[0]; f++) {
    flex_kernel *k;
    ck_assert_msg(flex_kernel_load(&k, tl_src_path(files[f]), NULL) == FLEX_OK, "%s: %s",
                  files[f], flex_last_error());
    for (int s = 0; s < 2; s++) {
      Case c;
      case_init(&c, k, s ? shapes[0] : tiny, seed++);
      c.args.dropout_p = 0.3f;
      c.args.dropout_seed = tl_rand(&c.seed), c.args.dropout_offset = tl_rand(&c.seed);
      char what[600];
      snprintf(what, sizeof what, "%s dropout 0.3 %s", files[f], s ? "shape 0" : "tiny");
      if (s) check_all_grads(&c, what);
      else check_every_element(&c, what);
      case_free(&c);
    }
    flex_kernel_free(k);
  }
}
END_TEST

START_TEST(samples_every_element) {
  uint64_t seed = tl_seed();
  const Dims tiny = {1, 2, 1, 5, 7, 3, 2};
  DIR *dir = opendir(tl_src_path("samples"));
  ck_assert_ptr_nonnull(dir);
  struct dirent *e;
  int nfiles = 0;
  while ((e = readdir(dir))) {
    size_t len = strlen(e->d_name);
    if (len < 7 || strcmp(e->d_name + len - 6, ".score")) continue;
    char rel[512];
    snprintf(rel, sizeof rel, "samples/%s", e->d_name);
    flex_kernel *k;
    ck_assert_msg(flex_kernel_load(&k, tl_src_path(rel), NULL) == FLEX_OK, "%s: %s", rel,
                  flex_last_error());
    Case c;
    case_init(&c, k, tiny, seed++);
    check_every_element(&c, rel);
    case_free(&c);
    flex_kernel_free(k);
    nfiles++;
  }
  closedir(dir);
  ck_assert_int_ge(nfiles, 9);
}
END_TEST

/* Plain softmax attention with GQA, written independently. */
static void naive(const Case *c, double scale, double *O, double *L) {
  Dims d = c->d;
  const double *q = c->q.a.data, *k = c->k_.a.data, *v = c->v.a.data;
  double *p = base_alloc(sizeof(double) * (size_t)d.KL);
  for (int b = 0; b < d.B; b++)
    for (int h = 0; h < d.H; h++)
      for (int i = 0; i < d.QL; i++) {
        int kh = h / (d.H / d.HKV);
        double mx = -INFINITY, sum = 0;
        for (int j = 0; j < d.KL; j++) {
          double s = 0;
          for (int e = 0; e < d.E; e++)
            s += q[(((size_t)b * d.H + h) * d.QL + i) * d.E + e] *
                 k[(((size_t)b * d.HKV + kh) * d.KL + j) * d.E + e];
          p[j] = s * scale;
          mx = fmax(mx, p[j]);
        }
        for (int j = 0; j < d.KL; j++) sum += (p[j] = exp(p[j] - mx));
        size_t row = ((size_t)b * d.H + h) * d.QL + i;
        L[row] = mx + log(sum);
        for (int e = 0; e < d.EV; e++) {
          double o = 0;
          for (int j = 0; j < d.KL; j++) o += p[j] / sum * v[(((size_t)b * d.HKV + kh) * d.KL + j) * d.EV + e];
          O[row * d.EV + e] = o;
        }
      }
  base_free(p);
}

static double rel_norm(const double *x, const double *ref, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; i++) {
    if (isnan(x[i])) return INFINITY;
    num += (x[i] - ref[i]) * (x[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return sqrt(num / den);
}

/* Compile an inline kernel; a failure shows the front end's message. */
static flex_kernel *from_source(const char *name, const char *src) {
  flex_kernel *k = NULL;
  ck_assert_msg(flex_kernel_from_source(&k, name, src, strlen(src), NULL) == FLEX_OK, "%s: %s", name,
                flex_last_error());
  return k;
}

/* The forward c just ran (O, LSE) equals the naive attention on c's
 * inputs and scale to 1e-12. */
static void expect_naive(Case *c) {
  double *O = base_alloc(sizeof(double) * (size_t)N(&c->out));
  double *L = base_alloc(sizeof(double) * (size_t)N(&c->lse));
  naive(c, c->args.scale ? c->args.scale : 1 / sqrt((double)c->d.E), O, L);
  ck_assert_double_lt(rel_norm(D(&c->out), O, N(&c->out)), 1e-12);
  ck_assert_double_lt(rel_norm(D(&c->lse), L, N(&c->lse)), 1e-12);
  base_free(O), base_free(L);
}

START_TEST(forward_matches_naive) {
  uint64_t seed = tl_seed() + 100;
  const char *src = "score id(s, b, h, q, kv) { return s; }\n";
  flex_kernel *k = from_source("plain.score", src);
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    Case c;
    case_init(&c, k, shapes[s], seed++);
    forward(&c);
    expect_naive(&c);
    case_free(&c);
  }
  flex_kernel_free(k);
}
END_TEST

START_TEST(half_inputs_decode_exactly) {
  /* float16 q, k, v: the reference must agree with the naive attention on
   * the decoded values. */
  uint64_t seed = tl_seed() + 200;
  const char *src = "score id(s, b, h, q, kv) { return s; }\n";
  flex_kernel *k = from_source("plain.score", src);
  Case c;
  case_init(&c, k, shapes[0], seed);
  TlArr h[3];
  TlArr *src3[3] = {&c.q, &c.k_, &c.v};
  for (int i = 0; i < 3; i++) {
    tl_arr_init(&h[i], rt_dtype(kDLFloat, 16), 4, src3[i]->a.shape);
    for (int64_t j = 0; j < N(src3[i]); j++) {
      rt_array_set(&h[i].a, j, D(src3[i])[j]);
      D(src3[i])[j] = rt_array_get(&h[i].a, j); /* the naive side sees the decoded value */
    }
  }
  c.args.q = &h[0].t, c.args.k = &h[1].t, c.args.v = &h[2].t;
  forward(&c);
  expect_naive(&c);
  for (int i = 0; i < 3; i++) tl_arr_free(&h[i]);
  case_free(&c);
  flex_kernel_free(k);
}
END_TEST

START_TEST(fully_masked_rows) {
  /* Rows q < 4 see nothing (mask), and the score itself returns -inf for
   * kv > q + 10: O = 0, LSE = -inf, zero gradients, no NaN anywhere. */
  uint64_t seed = tl_seed() + 300;
  const char *src = "buffer w: f32[H] grad;\n"
                    "score f(s, b, h, q, kv) { return where(kv > q + 10, -inf, s * w[h]); }\n"
                    "mask m(b, h, q, kv) { return kv < q - 3; }\n";
  flex_kernel *k = from_source("masked.score", src);
  Case c;
  case_init(&c, k, shapes[0], seed);
  backward(&c);
  Dims d = c.d;
  for (int b = 0; b < d.B; b++)
    for (int h = 0; h < d.H; h++)
      for (int i = 0; i < d.QL; i++) {
        size_t row = ((size_t)b * d.H + h) * d.QL + i;
        if (i < 4) ck_assert(isinf(D(&c.lse)[row]) && D(&c.lse)[row] < 0);
        else ck_assert(isfinite(D(&c.lse)[row]));
        for (int e = 0; e < d.EV && i < 4; e++) ck_assert(D(&c.out)[row * d.EV + e] == 0);
        for (int e = 0; e < d.E && i < 4; e++) ck_assert(D(&c.dq)[row * d.E + e] == 0);
      }
  TlArr *all[] = {&c.out, &c.dq, &c.dk, &c.dv, &c.grads[0]};
  for (size_t t = 0; t < 5; t++)
    for (int64_t i = 0; i < N(all[t]); i++) ck_assert(!isnan(D(all[t])[i]));
  check_all_grads(&c, "masked.score");
  case_free(&c);
  flex_kernel_free(k);
}
END_TEST

START_TEST(checked_runs) {
  uint64_t seed = tl_seed() + 400;
  /* An out-of-range read fails a checked run with the interpreter's message. */
  const char *src = "buffer t: f32[N];\nscore f(s, b, h, q, kv) {\n  return s + t[kv];\n}\n";
  flex_kernel *k = from_source("oob.score", src);
  Case c;
  case_init(&c, k, shapes[0], seed);
  int64_t small[1] = {5};
  tl_arr_free(&c.bufs[0]);
  tl_arr_init(&c.bufs[0], rt_dtype(kDLFloat, 32), 1, small);
  for (int i = 0; i < 5; i++) rt_array_set(&c.bufs[0].a, i, 0.5 + i);
  ck_assert_int_eq(flex_forward(k, &c.args), FLEX_ERR_RUNTIME);
  ck_assert_msg(strstr(flex_last_error(), "'t'") && strstr(flex_last_error(), "[5]") &&
                    strstr(flex_last_error(), "oob.score:3:14"),
                "%s", flex_last_error());
  ck_assert_int_eq(flex_backward(k, &c.args), FLEX_ERR_RUNTIME);
  /* Unchecked: no crash, and the in-range part is computed. */
  c.args.check_bounds = false;
  forward(&c);
  for (int64_t i = 0; i < N(&c.out); i++) ck_assert(isfinite(D(&c.out)[i]));
  case_free(&c);
  flex_kernel_free(k);
  /* A broken `sorted` promise. */
  ck_assert(flex_kernel_load(&k, tl_src_path("samples/document.score"), NULL) == FLEX_OK);
  case_init(&c, k, shapes[0], seed + 1);
  rt_array_set(&c.bufs[0].a, 3, 1000);
  ck_assert_int_eq(flex_forward(k, &c.args), FLEX_ERR_RUNTIME);
  ck_assert_msg(strstr(flex_last_error(), "sorted") && strstr(flex_last_error(), "doc"), "%s",
                flex_last_error());
  case_free(&c);
  flex_kernel_free(k);
}
END_TEST

START_TEST(validation_messages) {
  uint64_t seed = tl_seed() + 500;
  flex_kernel *k = tl_load("samples/gemma2.score", NULL, NULL);
  Case c;
  case_init(&c, k, shapes[0], seed);
  int64_t bad_shape[4] = {2, 3, 23, 15}, rank3[3] = {2, 4, 23};
  TlArr x;
  /* Each broken call, and a piece of its message. */
  struct { int what; const char *want; } cases[] = {
      {0, "not a multiple"}, {1, "rank-4"}, {2, "share a dtype"}, {3, "declared f32"},
      {4, "must be finite"}, {5, "is an int"}, {6, "unknown param 'nope'"}, {7, "unit stride"},
      {8, "host memory"}, {9, "'slopes' is read by the kernel"},
      {10, "dropout_p must be in [0, 1), got 1"}, {11, "dropout_p must be in [0, 1), got nan"},
      {12, "dropout_p must be in [0, 1), got -0.25"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    Case b = c;
    flex_param p[2] = {{"window", 3}, {"softcap", 2}};
    DLTensor t = c.k_.t;
    int64_t strides[4] = {2 * 56 * 15, 56 * 15, 15, 2};
    memset(&x, 0, sizeof x);
    switch (cases[i].what) {
    case 0: tl_arr_init(&x, F64, 4, bad_shape); b.args.k = &x.t; b.args.v = &x.t; break;
    case 1: tl_arr_init(&x, F64, 3, rank3); b.args.q = &x.t; break;
    case 2: tl_arr_init(&x, rt_dtype(kDLFloat, 32), 4, c.k_.a.shape); b.args.k = &x.t; break;
    case 3: tl_arr_init(&x, F64, 1, c.bufs[0].a.shape); b.fb[0].tensor = &x.t; b.args.buffers = b.fb; break;
    case 4: b.args.scale = INFINITY; break;
    case 5: p[0].value = 2.5; b.args.params = p; b.args.nparams = 2; break;
    case 6: p[0].name = "nope"; b.args.params = p; b.args.nparams = 1; break;
    case 7: t.strides = strides; b.args.k = &t; break;
    case 8: t.device.device_type = kDLCUDA; b.args.k = &t; break;
    case 9: b.args.nbuffers = 0; break;
    case 10: b.args.dropout_p = 1.0f; break;
    case 11: b.args.dropout_p = NAN; break;
    case 12: b.args.dropout_p = -0.25f; break;
    }
    ck_assert_int_eq(flex_forward(k, &b.args), FLEX_ERR_INVALID);
    ck_assert_msg(strstr(flex_last_error(), cases[i].want), "case %zu: %s", i, flex_last_error());
    tl_arr_free(&x);
  }
  /* Zero lengths where the math is well defined: KV_LEN 0 gives fully
   * masked rows, Q_LEN 0 and B 0 do nothing. */
  Dims zero[3] = {{1, 2, 1, 3, 0, 4, 4}, {1, 2, 1, 0, 5, 4, 4}, {0, 2, 1, 3, 5, 4, 4}};
  for (int z = 0; z < 3; z++) {
    Case e;
    case_init(&e, k, zero[z], seed + 10 + (uint64_t)z);
    backward(&e);
    for (int64_t i = 0; i < N(&e.lse); i++) ck_assert(isinf(D(&e.lse)[i]) && D(&e.lse)[i] < 0);
    for (int64_t i = 0; i < N(&e.out); i++) ck_assert(D(&e.out)[i] == 0);
    for (int64_t i = 0; i < N(&e.dq); i++) ck_assert(D(&e.dq)[i] == 0);
    case_free(&e);
  }
  case_free(&c);
  flex_kernel_free(k);
}
END_TEST

int main(void) {
  return TL_MAIN("reference", 120, TL_TEST(samples_against_finite_differences),
                 TL_TEST(samples_every_element), TL_TEST(dropout_against_finite_differences),
                 TL_TEST(forward_matches_naive), TL_TEST(half_inputs_decode_exactly),
                 TL_TEST(fully_masked_rows), TL_TEST(checked_runs), TL_TEST(validation_messages));
}
