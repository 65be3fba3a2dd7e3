/* Conformance of the numerics with docs/language.md's Semantics section, against an
 * attention written here from the spec alone: each probe's score and mask
 * are translated into C by hand (32-bit wrapping ints, C truncation,
 * x / 0 == 0, x % 0 == x, saturating int(float), fmod), with their partial
 * derivatives, so neither the interpreter nor autodiff is the oracle.
 * Every element of out, lse, dq, dk, dv and every grad buffer is compared;
 * fresh random inputs each run; outputs are poisoned first. Probe 4 covers
 * language version 2 (shifts with counts outside 0..31, bit operations,
 * floordiv and floormod, erf, helpers, sum, PyTorch parameter names). Also the
 * `flexc run` file contract and its exit statuses on bad values. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/npy.h"
#include "runtime/rt.h"
#include "testlib.h"

#define MAXBUF 8
#define MAXPART 8

/* Shapes of one call. */
typedef struct Dims {
  int B, H, HKV, QL, KL, E, EV;
} Dims;

/* One buffer of a probe: its declared dtype and shape, values as doubles. */
typedef struct BufSpec {
  const char *name;   /* as declared */
  DLDataType dt;      /* the declared dtype */
  int nd;             /* rank */
  int64_t shape[4];   /* extents */
  bool grad;          /* declared `grad` */
  double *val;        /* host values, row-major */
} BufSpec;

/* d t / d buffer element: buffer j, flat offset off. */
typedef struct Part {
  int buf;
  int64_t off;
  double d;
} Part;

/* t = keep ? score : -inf at one element, with its partial derivatives. */
typedef struct Elem {
  double t, dtds;      /* value (-INFINITY: masked) and d t / d s */
  Part p[MAXPART];     /* partials w.r.t. grad buffer elements */
  int np;
} Elem;

typedef struct Probe Probe;
/* The hand translation of a probe's mask and score. */
typedef void (*ElemFn)(const Probe *pr, double s, int b, int h, int q, int kv, Elem *e);

/* A .score program with its translation, buffers and launch values. */
struct Probe {
  const char *src;       /* the program */
  ElemFn fn;             /* its translation */
  Dims d;                /* shapes */
  double scale;          /* 0: 1/sqrt(E) */
  flex_param params[4];  /* overrides */
  int nparams;
  BufSpec buf[MAXBUF];
  int nbuf;
};

static const DLDataType F64 = {kDLFloat, 64, 1};
static const DLDataType F32 = {kDLFloat, 32, 1};

/* ---- the language's integer rules, written from docs/language.md -------------------- */

static int32_t W(int64_t x) { return (int32_t)(uint32_t)(uint64_t)x; }
static int32_t IDIV(int32_t a, int32_t b) {
  if (b == 0) return 0;
  if (a == INT32_MIN && b == -1) return INT32_MIN;
  return a / b;
}
static int32_t IMOD(int32_t a, int32_t b) {
  if (b == 0) return a;
  if (b == -1) return 0;
  return a % b;
}
static int32_t IABS(int32_t a) { return a < 0 ? W(-(int64_t)a) : a; }
static int32_t F2I(double x) {
  if (isnan(x)) return 0;
  if (x >= 2147483648.0) return INT32_MAX;
  if (x <= -2147483648.0) return INT32_MIN;
  return (int32_t)x;
}
/* A float literal: rounded to binary32 (docs/frontend.md). */
static double LIT(double x) { return (double)(float)x; }

static double bufv(const Probe *pr, int j, int64_t off) { return pr->buf[j].val[off]; }
static void part(Elem *e, int j, int64_t off, double d) {
  ck_assert(e->np < MAXPART);
  e->p[e->np++] = (Part){j, off, d};
}

/* ---- probe 1: integer and conversion semantics ---------------------------- */

static const char *int_src =
    "score f(s, b, h, q, kv) {\n"
    "    let big = (q + 1) * 1000000007;\n"
    "    let d = (q - kv) / (kv % 3);\n"
    "    let m = (q - kv) % (kv % 4);\n"
    "    let mn = q - 2147483647 - 1;\n"
    "    let neg1 = kv - kv - 1 + q * 0;\n"
    "    let o = mn / neg1 + mn % neg1;\n"
    "    let sat = int(float(q) * 1e10) % 7 + int(float(-q) * 1e10) % 5;\n"
    "    let n = int(sqrt(float(kv) - 5.0)) + int(-2.75 * float(kv));\n"
    "    return s * 1.5 + float(d) * 0.25 + float(m) * 0.125 + float(big % 1000) * 0.001\n"
    "           + float(o % 1000) * 0.0625 + float(abs(mn) % 977) * 0.03125\n"
    "           + float(sat) * 0.5 + float(n) * 0.25 + (float(q - kv) % 2.5) * 0.5;\n"
    "}\n";

static void int_fn(const Probe *pr, double s, int b, int h, int q, int kv, Elem *e) {
  (void)pr, (void)b, (void)h;
  int32_t big = W((int64_t)(q + 1) * 1000000007);
  int32_t d = IDIV(q - kv, IMOD(kv, 3)), m = IMOD(q - kv, IMOD(kv, 4));
  int32_t mn = W((int64_t)q - 2147483647 - 1);
  int32_t o = W((int64_t)IDIV(mn, -1) + IMOD(mn, -1));
  int32_t sat = IMOD(F2I(q * 1e10), 7) + IMOD(F2I(-q * 1e10), 5);
  double x = kv - 5.0;
  int32_t n = F2I(x < 0 ? NAN : sqrt(x)) + F2I(-2.75 * kv);
  e->t = s * 1.5 + d * 0.25 + m * 0.125 + IMOD(big, 1000) * LIT(0.001) + IMOD(o, 1000) * 0.0625 +
         IMOD(IABS(mn), 977) * 0.03125 + sat * 0.5 + n * 0.25 + fmod((double)(q - kv), 2.5) * 0.5;
  e->dtds = 1.5;
}

/* ---- probe 2: grad buffers through piecewise ops, softcap, -inf scores ---- */

static const char *grad_src =
    "buffer bias: f32[H, R] grad;\n"
    "buffer g: f32[H, 4] grad;\n"
    "buffer cap: f32[H] grad;\n"
    "mask m(b, h, q, kv) { return q % 4 != 1; }\n"
    "score f(s, b, h, q, kv) {\n"
    "    let x = where(q > kv, g[h, 0] * s, g[h, 1]);\n"
    "    let y = max(x, g[h, 2]) + clamp(abs(g[h, 3] * float(kv - 4)), 0.5, 2.0) * 0.5;\n"
    "    let t = cap[h] * tanh((s + bias[h, q - kv + KV_LEN - 1]) / cap[h]);\n"
    "    return where(kv % 5 == 3, -inf, t + y);\n"
    "}\n";

static void grad_fn(const Probe *pr, double s, int b, int h, int q, int kv, Elem *e) {
  (void)b;
  e->t = -INFINITY;
  if (q % 4 == 1 || kv % 5 == 3) return;
  int64_t R = pr->buf[0].shape[1], bi = h * R + (q - kv + pr->d.KL - 1), gi = h * 4;
  double c = bufv(pr, 2, h), a = s + bufv(pr, 0, bi), u = a / c, th = tanh(u);
  e->t = c * th;
  e->dtds = 1 - th * th;
  part(e, 0, bi, 1 - th * th);
  part(e, 2, h, th - u * (1 - th * th));
  double x, dxds = 0;
  Part px;
  if (q > kv) x = bufv(pr, 1, gi) * s, dxds = bufv(pr, 1, gi), px = (Part){1, gi, s};
  else x = bufv(pr, 1, gi + 1), px = (Part){1, gi + 1, 1};
  if (x >= bufv(pr, 1, gi + 2)) { /* ties go to the first operand */
    e->t += x, e->dtds += dxds;
    part(e, px.buf, px.off, px.d);
  } else {
    e->t += bufv(pr, 1, gi + 2);
    part(e, 1, gi + 2, 1);
  }
  double w = bufv(pr, 1, gi + 3) * (kv - 4), z = fabs(w), sg = w < 0 ? -1 : 1;
  e->t += fmin(fmax(z, 0.5), 2.0) * 0.5;
  if (z >= 0.5 && z <= 2.0) part(e, 1, gi + 3, 0.5 * sg * (kv - 4));
}

/* ---- probe 4: language version 2 ------------------------------------------ */

/* Shifts, Python's floor division and erf, written from docs/language.md. */
static int32_t SHL(int32_t a, int32_t n) { return n < 0 || n > 31 ? 0 : W((int64_t)((uint64_t)(uint32_t)a << n)); }
static int32_t SHR(int32_t a, int32_t n) {
  if (n < 0 || n > 31) return a < 0 ? -1 : 0;
  return (int32_t)floor((double)a / ldexp(1.0, n));
}
static int32_t FDIV(int32_t a, int32_t b) { return b == 0 ? 0 : (int32_t)floor((double)a / b); }
static int32_t FMOD(int32_t a, int32_t b) { return b == 0 ? a : W((int64_t)a - (int64_t)b * FDIV(a, b)); }

static const char *v2_src =
    "buffer w: f32[4] grad;\n"
    "float gate(float x, int k) { return x * (1.0 + erf(x * 0.5)) + float(k) * 0.03125; }\n"
    "int bits(int a, int b) { return ((a ^ b) & 7) | (a << (b - 3)) >> 28; }\n"
    "mask m(b, h, q, kv) { return ((q | kv) & 1) == 0 || floormod(q - kv, 3) != 2; }\n"
    "score f(score, b, h, q_idx, kv_idx) {\n"
    "    let fd = floordiv(kv_idx - q_idx, 3) * 4 + floormod(q_idx - 2 * kv_idx, -5);\n"
    "    let sh = (-q_idx >> (kv_idx - 2)) + (q_idx << 30) + ~kv_idx;\n"
    "    return gate(score, bits(q_idx, kv_idx)) + float(fd) * 0.125 + float(sh % 1000) * 0.0009765625\n"
    "           + sum(i, 0, 4, w[i] * float((q_idx + 2 * kv_idx + 5) >> i & 1));\n"
    "}\n";

/* The w term depends on kv: a term constant along a row only shifts that
 * row's softmax, so its gradient would be the row's dlse, and exactly zero
 * without one; comparing rounding noise against rounding noise says nothing. */
static void v2_fn(const Probe *pr, double s, int b, int h, int q, int kv, Elem *e) {
  (void)b, (void)h;
  e->t = -INFINITY;
  if (!(((q | kv) & 1) == 0 || FMOD(q - kv, 3) != 2)) return;
  int32_t k = ((q ^ kv) & 7) | SHR(SHL(q, kv - 3), 28);
  int32_t fd = W((int64_t)FDIV(kv - q, 3) * 4 + FMOD(q - 2 * kv, -5));
  int32_t sh = W((int64_t)SHR(-q, kv - 2) + SHL(q, 30) + ~kv);
  double x = s * 0.5;
  e->t = s * (1 + erf(x)) + k * 0.03125 + fd * 0.125 + IMOD(sh, 1000) * 0.0009765625;
  e->dtds = 1 + erf(x) + s * 0.5 * 1.1283791670955126 * exp(-x * x); /* 2/sqrt(pi) */
  for (int i = 0; i < 4; i++) {
    int bit = SHR(q + 2 * kv + 5, i) & 1;
    e->t += bufv(pr, 0, i) * bit;
    if (bit) part(e, 0, i, 1.0);
  }
}

static Probe v2_probe(Dims d) {
  Probe p = {v2_src, v2_fn, d, 0, {{0}}, 0, {{0}}, 1};
  p.buf[0] = (BufSpec){"w", F32, 1, {4}, true, NULL};
  return p;
}

/* ---- probe 3: int/u8/bool/i64 buffers, params, sizes, explicit scale ------ */

static const char *bufs_src =
    "param int window = 3;\n"
    "param float temp = 2.0;\n"
    "buffer doc: i64[KV_LEN] sorted;\n"
    "buffer qdoc: i32[Q_LEN] sorted;\n"
    "buffer w: u8[H];\n"
    "buffer allow: bool[Q_LEN, KV_LEN];\n"
    "buffer tbl: f32[N] grad;\n"
    "mask m(b, h, q, kv) { return (qdoc[q] == doc[kv] && abs(q - kv) <= window) || allow[q, kv]; }\n"
    "score f(s, b, h, q, kv) {\n"
    "    return s / temp + float(w[h]) * 0.0078125 + tbl[clamp(kv - q, 0, N - 1)]\n"
    "           + float(B * 1000 + H * 100 + HKV * 10 + Q_LEN - KV_LEN) * 0.0009765625;\n"
    "}\n";

static void bufs_fn(const Probe *pr, double s, int b, int h, int q, int kv, Elem *e) {
  (void)b;
  const Dims *d = &pr->d;
  e->t = -INFINITY;
  bool keep = (bufv(pr, 1, q) == bufv(pr, 0, kv) && abs(q - kv) <= 2) ||
              bufv(pr, 3, (int64_t)q * d->KL + kv) != 0;
  if (!keep) return;
  int64_t N = pr->buf[4].shape[0], ti = kv - q < 0 ? 0 : kv - q > N - 1 ? N - 1 : kv - q;
  e->t = s / 0.75 + bufv(pr, 2, h) * 0.0078125 + bufv(pr, 4, ti) +
         (d->B * 1000 + d->H * 100 + d->HKV * 10 + d->QL - d->KL) * 0.0009765625;
  e->dtds = 1 / 0.75;
  part(e, 4, ti, 1);
}

/* ---- the spec's attention, forward and backward, in float64 --------------- */

/* Inputs and outputs of one call, all float64, row-major. */
typedef struct Ref {
  double *q, *k, *v, *dout, *dlse;   /* inputs (dlse may be NULL) */
  double *out, *lse, *dq, *dk, *dv;  /* outputs */
  double *dbuf[MAXBUF];              /* grad buffer gradients (NULL: none) */
} Ref;

static void spec_attention(const Probe *pr, Ref *r) {
  const Dims *d = &pr->d;
  int G = d->H / d->HKV, KL = d->KL, E = d->E, EV = d->EV;
  double scale = pr->scale != 0 ? pr->scale : 1 / sqrt((double)E);
  Elem *el = base_alloc(sizeof(Elem) * (size_t)KL);
  double *P = base_alloc(sizeof(double) * (size_t)KL);
  for (int b = 0; b < d->B; b++)
    for (int h = 0; h < d->H; h++)
      for (int i = 0; i < d->QL; i++) {
        int64_t row = ((int64_t)b * d->H + h) * d->QL + i, kb = ((int64_t)b * d->HKV + h / G) * KL;
        const double *qi = r->q + row * E;
        double mx = -INFINITY, sum = 0;
        for (int j = 0; j < KL; j++) {
          double s = 0;
          for (int e = 0; e < E; e++) s += qi[e] * r->k[(kb + j) * E + e];
          memset(&el[j], 0, sizeof el[j]);
          pr->fn(pr, scale * s, b, h, i, j, &el[j]);
          mx = fmax(mx, el[j].t);
        }
        for (int j = 0; j < KL; j++) sum += mx == -INFINITY ? 0 : exp(el[j].t - mx);
        r->lse[row] = mx == -INFINITY ? -INFINITY : mx + log(sum);
        double *o = r->out + row * EV;
        for (int e = 0; e < EV; e++) o[e] = 0;
        for (int j = 0; j < KL; j++) {
          P[j] = mx == -INFINITY || el[j].t == -INFINITY ? 0 : exp(el[j].t - r->lse[row]);
          for (int e = 0; e < EV; e++) o[e] += P[j] * r->v[(kb + j) * EV + e];
        }
        if (!r->dout) continue;
        const double *dO = r->dout + row * EV;
        double D = r->dlse ? -r->dlse[row] : 0;
        for (int e = 0; e < EV; e++) D += dO[e] * o[e];
        for (int j = 0; j < KL; j++) {
          if (P[j] == 0) continue;
          double dP = 0;
          for (int e = 0; e < EV; e++) {
            dP += dO[e] * r->v[(kb + j) * EV + e];
            r->dv[(kb + j) * EV + e] += P[j] * dO[e];
          }
          double dt = P[j] * (dP - D), ds = dt * el[j].dtds;
          for (int e = 0; e < E; e++) {
            r->dq[row * E + e] += scale * ds * r->k[(kb + j) * E + e];
            r->dk[(kb + j) * E + e] += scale * ds * qi[e];
          }
          for (int p = 0; p < el[j].np; p++) r->dbuf[el[j].p[p].buf][el[j].p[p].off] += dt * el[j].p[p].d;
        }
      }
  base_free(el);
  base_free(P);
}

/* ---- running a probe through the library ----------------------------------- */

/* One tensor under test and its oracle twin. */
typedef struct Slot {
  TlArr x;      /* in the backend's dtype */
  RtArray ref;  /* float64 oracle values */
} Slot;

static void slot_init(Slot *s, DLDataType dt, int nd, const int64_t *shape) {
  tl_arr_init(&s->x, dt, nd, shape);
  rt_array_init(&s->ref, F64, nd, shape);
}
static void slot_free(Slot *s) {
  tl_arr_free(&s->x);
  rt_array_free(&s->ref);
}
static double *R(Slot *s) { return s->ref.data; }

/* Random inputs rounded to dt, copied exactly into the oracle's arrays. */
static void slot_normal(Slot *s, uint64_t *rng) {
  tl_arr_normal(&s->x, rng);
  for (int64_t i = 0; i < rt_array_count(&s->ref); i++) R(s)[i] = rt_array_get(&s->x.a, i);
}

static void compare(const char *what, const char *name, Slot *s, double tol) {
  double err = tl_rel_err(&s->x.a, &s->ref);
  if (!(err <= tol)) /* name the first element that is off */
    for (int64_t i = 0; i < rt_array_count(&s->ref); i++) {
      double x = rt_array_get(&s->x.a, i), y = R(s)[i];
      if (x != y && !(fabs(x - y) <= tol * fabs(y)))
        ck_abort_msg("%s: %s relative error %.3g > %.3g; element %lld is %.17g, expected %.17g",
                     what, name, err, tol, (long long)i, x, y);
    }
  ck_assert_msg(err <= tol, "%s: %s relative error %.3g > %.3g", what, name, err, tol);
}

/* Fill the probe's buffers: float values on a 2^-8 grid (exact in every
 * float dtype), and whatever the int buffers need. */
static void fill_buffers(Probe *pr, uint64_t *rng, TlArr *bt, flex_buffer *fb, Slot *gs,
                         DLDataType gdt) {
  for (int j = 0; j < pr->nbuf; j++) {
    BufSpec *b = &pr->buf[j];
    tl_arr_init(&bt[j], b->dt, b->nd, b->shape);
    int64_t n = rt_array_count(&bt[j].a);
    b->val = base_alloc(sizeof(double) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) {
      double x;
      if (b->dt.code == kDLFloat) x = ldexp(round(ldexp(0.4 + 1.2 * tl_uniform(rng), 8)), -8);
      else if (b->dt.code == kDLBool) x = tl_uniform(rng) < 0.2;
      else if (b->dt.code == kDLUInt) x = (double)((int[]){3, 200, 255, 17})[i % 4];
      else x = (double)(int)(tl_uniform(rng) * 3); /* sorted below */
      b->val[i] = x;
    }
    if (b->dt.code == kDLInt) /* the `sorted` ids: non-decreasing */
      for (int64_t i = 1; i < n; i++) b->val[i] = fmax(b->val[i], b->val[i - 1]);
    if (!strcmp(b->name, "g")) /* g[h, 0] of either sign, so max/where take both branches */
      for (int64_t i = 0; i < n; i += 4) b->val[i] -= 1;
    for (int64_t i = 0; i < n; i++) rt_array_set(&bt[j].a, i, b->val[i]);
    fb[j] = (flex_buffer){b->name, &bt[j].t, NULL};
    if (b->grad) {
      slot_init(&gs[j], gdt, b->nd, b->shape);
      tl_arr_poison(&gs[j].x);
      fb[j].grad = &gs[j].x.t;
    }
  }
}

/* Run probe pr on backend `be` in dtype dt; compare everything with the
 * spec's attention within (tol, gtol). */
static void run_probe(Probe *pr, const char *what, flex_backend be, DLDataType dt, double tol,
                      double gtol, bool with_dlse) {
  const Dims *d = &pr->d;
  uint64_t rng = tl_seed() ^ (uint64_t)(uintptr_t)what;
  flex_kernel *k = NULL;
  ck_assert_msg(flex_kernel_from_source(&k, "probe.score", pr->src, strlen(pr->src), NULL) == FLEX_OK,
                "%s: %s", what, flex_last_error());
  int64_t sq[4] = {d->B, d->H, d->QL, d->E}, sk[4] = {d->B, d->HKV, d->KL, d->E};
  int64_t sv[4] = {d->B, d->HKV, d->KL, d->EV}, so[4] = {d->B, d->H, d->QL, d->EV};
  Slot q, kk, v, dout, dlse, out, lse, dq, dk, dv, gs[MAXBUF];
  TlArr bt[MAXBUF];
  flex_buffer fb[MAXBUF];
  memset(gs, 0, sizeof gs), memset(bt, 0, sizeof bt);
  DLDataType odt = be == FLEX_BACKEND_REFERENCE ? F64 : F32;
  slot_init(&q, dt, 4, sq), slot_init(&kk, dt, 4, sk), slot_init(&v, dt, 4, sv);
  slot_init(&dout, dt, 4, so), slot_init(&dlse, odt, 3, so);
  slot_init(&out, be == FLEX_BACKEND_REFERENCE ? F64 : dt, 4, so), slot_init(&lse, odt, 3, so);
  slot_init(&dq, be == FLEX_BACKEND_REFERENCE ? F64 : dt, 4, sq);
  slot_init(&dk, be == FLEX_BACKEND_REFERENCE ? F64 : dt, 4, sk);
  slot_init(&dv, be == FLEX_BACKEND_REFERENCE ? F64 : dt, 4, sv);
  Slot *ins[] = {&q, &kk, &v, &dout, &dlse};
  for (int i = 0; i < 5; i++) slot_normal(ins[i], &rng);
  fill_buffers(pr, &rng, bt, fb, gs, odt);
  Ref r = {R(&q), R(&kk), R(&v), R(&dout), with_dlse ? R(&dlse) : NULL,
           R(&out), R(&lse), R(&dq), R(&dk), R(&dv), {NULL}};
  for (int j = 0; j < pr->nbuf; j++) r.dbuf[j] = pr->buf[j].grad ? R(&gs[j]) : NULL;
  spec_attention(pr, &r);

  flex_args a;
  memset(&a, 0, sizeof a);
  a.backend = be;
  a.q = &q.x.t, a.k = &kk.x.t, a.v = &v.x.t, a.out = &out.x.t, a.lse = &lse.x.t;
  a.dout = &dout.x.t, a.dlse = with_dlse ? &dlse.x.t : NULL;
  a.dq = &dq.x.t, a.dk = &dk.x.t, a.dv = &dv.x.t;
  a.scale = pr->scale;
  a.params = pr->params, a.nparams = pr->nparams;
  a.buffers = fb, a.nbuffers = pr->nbuf;
  Slot *outs[] = {&out, &lse, &dq, &dk, &dv};
  for (int i = 0; i < 5; i++) tl_arr_poison(&outs[i]->x);
  ck_assert_msg(flex_forward(k, &a) == FLEX_OK, "%s forward: %s", what, flex_last_error());
  ck_assert_msg(flex_backward(k, &a) == FLEX_OK, "%s backward: %s", what, flex_last_error());
  compare(what, "out", &out, tol), compare(what, "lse", &lse, tol);
  compare(what, "dq", &dq, gtol), compare(what, "dk", &dk, gtol), compare(what, "dv", &dv, gtol);
  for (int j = 0; j < pr->nbuf; j++)
    if (pr->buf[j].grad) compare(what, pr->buf[j].name, &gs[j], gtol);

  for (int i = 0; i < 5; i++) slot_free(ins[i]), slot_free(outs[i]);
  for (int j = 0; j < pr->nbuf; j++) {
    tl_arr_free(&bt[j]);
    if (pr->buf[j].grad) slot_free(&gs[j]);
    base_free(pr->buf[j].val);
  }
  flex_kernel_free(k);
}

static Probe int_probe(Dims d) { return (Probe){int_src, int_fn, d, 0, {{0}}, 0, {{0}}, 0}; }

static Probe grad_probe(Dims d) {
  Probe p = {grad_src, grad_fn, d, 0, {{0}}, 0, {{0}}, 3};
  p.buf[0] = (BufSpec){"bias", F32, 2, {d.H, d.QL + d.KL - 1}, true, NULL};
  p.buf[1] = (BufSpec){"g", F32, 2, {d.H, 4}, true, NULL};
  p.buf[2] = (BufSpec){"cap", F32, 1, {d.H}, true, NULL};
  return p;
}

static Probe bufs_probe(Dims d) {
  Probe p = {bufs_src, bufs_fn, d, 0.375, {{"window", 2}, {"temp", 0.75}}, 2, {{0}}, 5};
  p.buf[0] = (BufSpec){"doc", rt_dtype(kDLInt, 64), 1, {d.KL}, false, NULL};
  p.buf[1] = (BufSpec){"qdoc", rt_dtype(kDLInt, 32), 1, {d.QL}, false, NULL};
  p.buf[2] = (BufSpec){"w", rt_dtype(kDLUInt, 8), 1, {d.H}, false, NULL};
  p.buf[3] = (BufSpec){"allow", rt_dtype(kDLBool, 8), 2, {d.QL, d.KL}, false, NULL};
  p.buf[4] = (BufSpec){"tbl", F32, 1, {5}, true, NULL};
  return p;
}

/* GQA with EV != E and Q_LEN != KV_LEN; MQA with one query; one key. */
static const Dims shapes[] = {{2, 4, 2, 9, 14, 15, 9}, {1, 3, 1, 1, 17, 8, 8}, {2, 2, 1, 11, 1, 4, 6}};

START_TEST(reference_int_semantics) {
  for (int i = 0; i < 3; i++) {
    Probe p = int_probe(shapes[i]);
    run_probe(&p, "int semantics", FLEX_BACKEND_REFERENCE, F64, 1e-12, 1e-12, i != 1);
  }
}
END_TEST

START_TEST(reference_grad_buffers) {
  for (int i = 0; i < 3; i++) {
    Probe p = grad_probe(shapes[i]);
    run_probe(&p, "grad buffers", FLEX_BACKEND_REFERENCE, F64, 1e-12, 1e-12, i != 1);
  }
}
END_TEST

START_TEST(reference_buffers_params) {
  Dims d = {2, 4, 2, 10, 14, 8, 12};
  Probe p = bufs_probe(d);
  run_probe(&p, "buffers and params", FLEX_BACKEND_REFERENCE, F64, 1e-12, 1e-12, true);
}
END_TEST

START_TEST(reference_v2_semantics) {
  for (int i = 0; i < 3; i++) {
    Probe p = v2_probe(shapes[i]);
    /* gradients: erf's derivative carries 2/sqrt(pi) as a binary32 constant
     * (relative error 6e-8), as exp2's carries ln 2 */
    run_probe(&p, "version 2", FLEX_BACKEND_REFERENCE, F64, 1e-12, 2e-7, i != 1);
  }
}
END_TEST

/* The emulator runs the generated kernels: the same oracle, fp32 limits. */
START_TEST(emu_fp32_against_spec) {
  Dims d = {2, 4, 2, 9, 14, 16, 8};
  Probe p = grad_probe(d);
  run_probe(&p, "emu grad buffers", FLEX_BACKEND_EMU, F32, 1e-4, 1e-3, true);
  Probe pi = int_probe(d);
  run_probe(&pi, "emu int semantics", FLEX_BACKEND_EMU, F32, 1e-4, 1e-3, false);
  Probe pv = v2_probe(d);
  run_probe(&pv, "emu version 2", FLEX_BACKEND_EMU, F32, 1e-4, 1e-3, true);
}
END_TEST

/* ---- flexc run: the file contract and the exit statuses ------------------- */

static char dir[64];

static void write_npy(const char *name, RtArray *a) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  ck_assert_msg(rt_npy_write(path, a) == 0, "%s", flex_last_error());
}

static int flexc(const char *extra, Buf *out) {
  Buf cmd = {0};
  buf_printf(&cmd, "%s run %s/p.score --q %s/q.npy --k %s/k.npy --v %s/v.npy %s", tl_flexc(), dir,
             dir, dir, dir, extra);
  int st = tl_run(cmd.data, out);
  buf_free(&cmd);
  ck_assert_msg(st >= 0 && st < 128, "flexc died (status %d): %s", st, out->data);
  return st;
}

static RtArray load(const char *name) {
  char path[512];
  snprintf(path, sizeof path, "%s/o/%s", dir, name);
  RtArray a;
  ck_assert_msg(rt_npy_read(path, &a) == 0, "%s", flex_last_error());
  return a;
}

START_TEST(cli_file_contract) {
  snprintf(dir, sizeof dir, "/tmp/flexc_conform_%d", (int)getpid());
  char cmd[256];
  snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", dir, dir);
  ck_assert_int_eq(system(cmd), 0);
  uint64_t rng = tl_seed() ^ 77;
  Dims d = {1, 4, 2, 6, 9, 16, 8};
  Probe p = int_probe(d);
  char path[512];
  snprintf(path, sizeof path, "%s/p.score", dir);
  FILE *f = fopen(path, "w");
  fputs(p.src, f);
  fclose(f);
  int64_t sq[4] = {1, 4, 6, 16}, sk[4] = {1, 2, 9, 16}, sv[4] = {1, 2, 9, 8}, so[4] = {1, 4, 6, 8};
  Slot q, k, v, dout, out, lse, dq, dk, dv;
  slot_init(&q, rt_dtype(kDLFloat, 16), 4, sq), slot_init(&k, F64, 4, sk), slot_init(&v, F32, 4, sv);
  slot_init(&dout, F32, 4, so), slot_init(&out, F64, 4, so), slot_init(&lse, F64, 3, so);
  slot_init(&dq, F64, 4, sq), slot_init(&dk, F64, 4, sk), slot_init(&dv, F64, 4, sv);
  slot_normal(&q, &rng), slot_normal(&k, &rng), slot_normal(&v, &rng), slot_normal(&dout, &rng);
  /* float64 k on the binary32 grid: flexc run casts inputs to fp32 */
  for (int64_t i = 0; i < rt_array_count(&k.ref); i++) {
    R(&k)[i] = (double)(float)R(&k)[i];
    rt_array_set(&k.x.a, i, R(&k)[i]);
  }
  write_npy("q.npy", &q.x.a), write_npy("k.npy", &k.x.a), write_npy("v.npy", &v.x.a);
  write_npy("do.npy", &dout.x.a);
  Ref r = {R(&q), R(&k), R(&v), R(&dout), NULL, R(&out), R(&lse), R(&dq), R(&dk), R(&dv), {NULL}};
  spec_attention(&p, &r);

  Buf o = {0};
  char extra[512];
  snprintf(extra, sizeof extra, "--dout %s/do.npy --backend reference --out %s/o", dir, dir);
  ck_assert_msg(flexc(extra, &o) == 0, "%s", o.data);
  const char *names[] = {"out.npy", "lse.npy", "dq.npy", "dk.npy", "dv.npy"};
  Slot *want[] = {&out, &lse, &dq, &dk, &dv};
  for (int i = 0; i < 5; i++) {
    RtArray a = load(names[i]);
    ck_assert_msg(a.dtype.code == kDLFloat && a.dtype.bits == 64, "%s is %s, not float64", names[i],
                  rt_dtype_name(a.dtype));
    ck_assert_int_eq(a.ndim, want[i]->ref.ndim);
    for (int j = 0; j < a.ndim; j++) ck_assert_int_eq(a.shape[j], want[i]->ref.shape[j]);
    double err = tl_rel_err(&a, &want[i]->ref);
    ck_assert_msg(err <= 1e-12, "%s: relative error %.3g", names[i], err);
    rt_array_free(&a);
  }
  buf_free(&o);

  /* Bad values are errors in the input (1); misuse of the command is 2. */
  struct { const char *extra, *want; int status; } cases[] = {
      {"--scale abc --out %s/o", "--scale", 1},
      {"--scale '' --out %s/o", "--scale", 1},
      {"--scale 0 --out %s/o", "nonzero", 1},
      {"--param window=abc --out %s/o", "not a number", 1},
      {"--dlse %s/do.npy --out %s/o", "--dout", 2},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    snprintf(extra, sizeof extra, cases[i].extra, dir, dir);
    Buf msg = {0};
    int st = flexc(extra, &msg);
    ck_assert_msg(st == cases[i].status && strstr(msg.data, cases[i].want),
                  "case %zu: status %d, output: %s", i, st, msg.data);
    buf_free(&msg);
  }
  for (int i = 0; i < 5; i++) slot_free(want[i]);
  slot_free(&q), slot_free(&k), slot_free(&v), slot_free(&dout);
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd)) fprintf(stderr, "could not remove %s\n", dir);
}
END_TEST

int main(void) {
  return TL_MAIN("conform", 0, TL_TEST(reference_int_semantics), TL_TEST(reference_grad_buffers),
                 TL_TEST(reference_buffers_params), TL_TEST(reference_v2_semantics),
                 TL_TEST(emu_fp32_against_spec), TL_TEST(cli_file_contract));
}
