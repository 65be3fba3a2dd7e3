/* Dropout on the emulator (the generated CUDA templates run on the CPU),
 * and on the cpu backend where this build has it (TCase "cpu": the same
 * tests), against the float64 reference (docs/language.md "Dropout"):
 *
 *  - the dropped elements themselves: identity score, V the identity
 *    matrix (EV = KV_LEN), so O[i, j] = P_ij M_ij and O's zeros are exactly
 *    the dropped (i, j); the two backends' zero patterns must be equal, for
 *    fp32 (flex_fwd_simt) and bf16 (flex_fwd_tc), with GQA and B, H > 1;
 *  - O, LSE and the gradients (dq, dk, dv and a `grad` buffer) of a few
 *    samples within the project's tolerances, on small odd shapes;
 *  - a packed (varlen) call: the same identity-V trick, both backends'
 *    zeros equal to the rule written out here with b the sequence index
 *    and i, j within the sequence;
 *  - a head dim of 128 with an identity score, where dropout takes other
 *    forward tiles (128 x 32) than the call without it on emu and cuda;
 *  - p = 0 is bitwise the call without dropout.
 *
 * --cuda runs the same cases on the GPU (tensors mirrored by tl_call) in
 * place of the emulator; it exits 77 where there is no CUDA device.
 *
 * Fresh random inputs every run (tl_seed); outputs are poisoned first. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/philox.cuh"
#include "runtime/flex.h"
#include "runtime/npy.h"
#include "testlib.h"

static uint64_t rng;
static flex_backend dev = FLEX_BACKEND_EMU; /* the backend under test (TCase "cpu": the cpu one) */

static void use_cpu(void) { dev = FLEX_BACKEND_CPU; }

static flex_kernel *load(const char *path, const char *src) { return tl_load(path, "ident", src); }

static void set_dropout(flex_args *a, float p, uint64_t seed, uint64_t offset) {
  a->dropout_p = p, a->dropout_seed = seed, a->dropout_offset = offset;
}

/* _i: 0 fp32, 1 bf16, 2 fp16. */
START_TEST(same_dropped_elements) {
  const TlDtype *td = &tl_dtypes[_i == 0 ? 0 : _i == 1 ? 2 : 1];
  DLDataType dt = rt_dtype(td->code, td->bits), f32 = rt_dtype(kDLFloat, 32);
  enum { B = 2, H = 4, HKV = 2, QL = 21, KL = 40, E = 8 };
  flex_kernel *k = load(NULL, "score ident(s, b, h, q, kv) { return s; }\n");
  int64_t qs[4] = {B, H, QL, E}, ks[4] = {B, HKV, KL, E}, vs[4] = {B, HKV, KL, KL};
  int64_t os[4] = {B, H, QL, KL}, ls[3] = {B, H, QL};
  TlPair q, kk, v, out, lse;
  tl_pair_init(&q, dt, 4, qs, true, &rng), tl_pair_init(&kk, dt, 4, ks, true, &rng);
  tl_pair_init(&v, dt, 4, vs, false, &rng);
  for (int64_t n = 0; n < B * HKV * KL * KL; n++) {
    double x = (n / KL) % KL == n % KL ? 1.0 : 0.0;
    rt_array_set(&v.x, n, x), rt_array_set(&v.ref, n, x);
  }
  tl_pair_init(&out, dt, 4, os, false, &rng), tl_pair_init(&lse, f32, 3, ls, false, &rng);
  flex_args a = {0}, r = {0};
  a.backend = dev, r.backend = FLEX_BACKEND_REFERENCE;
  a.q = &q.tx, a.k = &kk.tx, a.v = &v.tx, a.out = &out.tx, a.lse = &lse.tx;
  r.q = &q.tref, r.k = &kk.tref, r.v = &v.tref, r.out = &out.tref, r.lse = &lse.tref;
  const float ps[2] = {0.2f, 0.6f};
  for (int t = 0; t < 2; t++) {
    uint64_t seed = tl_rand(&rng), off = tl_rand(&rng);
    set_dropout(&a, ps[t], seed, off), set_dropout(&r, ps[t], seed, off);
    ck_assert_msg(flex_forward(k, &r) == FLEX_OK, "reference: %s", flex_last_error());
    ck_assert_msg(tl_call(k, &a, false) == FLEX_OK, "%s: %s", flex_backend_name(dev), flex_last_error());
    long dropped = 0, n = (long)B * H * QL * KL;
    for (long e = 0; e < n; e++) {
      double x = rt_array_get(&out.x, e), y = rt_array_get(&out.ref, e);
      ck_assert_msg(y > 0 || y == 0, "reference O[%ld] = %g", e, y);
      ck_assert_msg((x == 0) == (y == 0), "%s p %g: O[%ld] (b %ld h %ld i %ld j %ld) tested %g, reference %g",
                    td->name, ps[t], e, e / (H * QL * KL), e / (QL * KL) % H, e / KL % QL, e % KL, x, y);
      dropped += y == 0;
    }
    double err = tl_pair_err(&out);
    fprintf(stderr, "  %s %s p %.1f: %ld of %ld dropped on both; O error %.2g\n",
            flex_backend_name(dev), td->name, ps[t],
            dropped, n, err);
    ck_assert_msg(err < td->tol, "%s: O error %g (tol %g)", td->name, err, td->tol);
    ck_assert(dropped > n * ps[t] / 2 && dropped < n * (ps[t] + 1) / 2);
  }
  TlPair *all[] = {&q, &kk, &v, &out, &lse};
  for (int i = 0; i < 5; i++) tl_pair_free(all[i]);
  flex_kernel_free(k);
}
END_TEST

/* A packed call of three sequences, identity score, V the identity per
 * sequence (EV = the longest KV_LEN): O[t, h, e] = P M of query t's row at
 * key e of its sequence. _i: 0 fp32, 1 bf16. */
START_TEST(packed_dropped_elements) {
  const TlDtype *td = &tl_dtypes[_i == 0 ? 0 : 2];
  DLDataType dt = rt_dtype(td->code, td->bits), f32 = rt_dtype(kDLFloat, 32);
  enum { NS = 3, H = 2, HKV = 1, E = 8, EV = 11 };
  static const int32_t cq[NS + 1] = {0, 5, 14, 17}, ck[NS + 1] = {0, 7, 11, 22};
  const int TQ = cq[NS], TK = ck[NS];
  flex_kernel *k = load(NULL, "score ident(s, b, h, q, kv) { return s; }\n");
  int64_t qs[3] = {TQ, H, E}, ks[3] = {TK, HKV, E}, vs[3] = {TK, HKV, EV}, os[3] = {TQ, H, EV};
  int64_t ls[2] = {H, TQ}, cs[1] = {NS + 1};
  TlPair q, kk, v, out, lse;
  tl_pair_init(&q, dt, 3, qs, true, &rng), tl_pair_init(&kk, dt, 3, ks, true, &rng);
  tl_pair_init(&v, dt, 3, vs, false, &rng);
  for (int s = 0; s < NS; s++)
    for (int t = ck[s]; t < ck[s + 1]; t++)
      for (int e = 0; e < EV; e++) {
        double x = e == t - ck[s] ? 1.0 : 0.0;
        rt_array_set(&v.x, (int64_t)t * EV + e, x), rt_array_set(&v.ref, (int64_t)t * EV + e, x);
      }
  tl_pair_init(&out, dt, 3, os, false, &rng), tl_pair_init(&lse, f32, 2, ls, false, &rng);
  RtArray cuq, cuk;
  rt_array_init(&cuq, rt_dtype(kDLInt, 32), 1, cs), rt_array_init(&cuk, rt_dtype(kDLInt, 32), 1, cs);
  for (int s = 0; s <= NS; s++) rt_array_set(&cuq, s, cq[s]), rt_array_set(&cuk, s, ck[s]);
  DLTensor tcq = rt_array_tensor(&cuq), tck = rt_array_tensor(&cuk);
  flex_args a = {0}, r = {0};
  a.backend = dev, r.backend = FLEX_BACKEND_REFERENCE;
  a.q = &q.tx, a.k = &kk.tx, a.v = &v.tx, a.out = &out.tx, a.lse = &lse.tx;
  r.q = &q.tref, r.k = &kk.tref, r.v = &v.tref, r.out = &out.tref, r.lse = &lse.tref;
  a.cu_seqlens_q = r.cu_seqlens_q = &tcq, a.cu_seqlens_kv = r.cu_seqlens_kv = &tck;
  uint64_t seed = tl_rand(&rng), off = tl_rand(&rng);
  const float p = 0.4f;
  set_dropout(&a, p, seed, off), set_dropout(&r, p, seed, off);
  ck_assert_msg(flex_forward(k, &r) == FLEX_OK, "reference: %s", flex_last_error());
  ck_assert_msg(tl_call(k, &a, false) == FLEX_OK, "%s: %s", flex_backend_name(dev), flex_last_error());
  long dropped = 0, n = 0;
  for (int s = 0; s < NS; s++)
    for (int h = 0; h < H; h++)
      for (int i = 0; i < cq[s + 1] - cq[s]; i++)
        for (int j = 0; j < ck[s + 1] - ck[s]; j++, n++) {
          uint32_t w[4];
          flex_dropout_words(w, (uint32_t)seed, (uint32_t)(seed >> 32), flex_dropout_ctr3(off),
                             (uint32_t)(s * H + h), (uint32_t)i, (uint32_t)j >> 2);
          bool keep = flex_dropout_keep(flex_dropout_word(w, (uint32_t)j & 3), p);
          int64_t e = ((int64_t)(cq[s] + i) * H + h) * EV + j;
          double x = rt_array_get(&out.x, e), y = rt_array_get(&out.ref, e);
          ck_assert_msg((x != 0) == keep && (y != 0) == keep,
                        "%s seq %d h %d i %d j %d: keep %d, tested %g, reference %g", td->name, s, h,
                        i, j, keep, x, y);
          dropped += !keep;
        }
  fprintf(stderr, "  %s packed %s p %.1f: %ld of %ld dropped on both, as the rule says\n",
          flex_backend_name(dev), td->name,
          p, dropped, n);
  ck_assert(dropped > 0 && dropped < n);
  TlPair *all[] = {&q, &kk, &v, &out, &lse};
  for (int i = 0; i < 5; i++) tl_pair_free(all[i]);
  rt_array_free(&cuq), rt_array_free(&cuk);
  flex_kernel_free(k);
}
END_TEST

/* Head dim 128, identity score, bf16: the dropout forward runs 128 x 32
 * tiles (codegen/kernel.c), the call without it 128 x 64. O against the
 * reference, and its zeros (V the identity, EV = KV_LEN = 128). */
START_TEST(wide_head_dim) {
  const TlDtype *td = &tl_dtypes[2];
  DLDataType dt = rt_dtype(td->code, td->bits), f32 = rt_dtype(kDLFloat, 32);
  enum { B = 1, H = 2, HKV = 1, QL = 20, KL = 128, E = 128 };
  flex_kernel *k = load(NULL, "score ident(s, b, h, q, kv) { return s; }\n");
  int64_t qs[4] = {B, H, QL, E}, ks[4] = {B, HKV, KL, E}, os[4] = {B, H, QL, KL}, ls[3] = {B, H, QL};
  TlPair q, kk, v, out, lse;
  tl_pair_init(&q, dt, 4, qs, true, &rng), tl_pair_init(&kk, dt, 4, ks, true, &rng);
  tl_pair_init(&v, dt, 4, ks, false, &rng);
  for (int64_t n = 0; n < (int64_t)B * HKV * KL * KL; n++) {
    double x = (n / KL) % KL == n % KL ? 1.0 : 0.0;
    rt_array_set(&v.x, n, x), rt_array_set(&v.ref, n, x);
  }
  tl_pair_init(&out, dt, 4, os, false, &rng), tl_pair_init(&lse, f32, 3, ls, false, &rng);
  flex_args a = {0}, r = {0};
  a.backend = dev, r.backend = FLEX_BACKEND_REFERENCE;
  a.q = &q.tx, a.k = &kk.tx, a.v = &v.tx, a.out = &out.tx, a.lse = &lse.tx;
  r.q = &q.tref, r.k = &kk.tref, r.v = &v.tref, r.out = &out.tref, r.lse = &lse.tref;
  uint64_t seed = tl_rand(&rng), off = tl_rand(&rng);
  set_dropout(&a, 0.3f, seed, off), set_dropout(&r, 0.3f, seed, off);
  ck_assert_msg(flex_forward(k, &r) == FLEX_OK, "reference: %s", flex_last_error());
  ck_assert_msg(tl_call(k, &a, false) == FLEX_OK, "%s: %s", flex_backend_name(dev), flex_last_error());
  for (int64_t e = 0; e < rt_array_count(&out.x); e++)
    ck_assert_msg((rt_array_get(&out.x, e) == 0) == (rt_array_get(&out.ref, e) == 0),
                  "O[%lld]: tested %g, reference %g", (long long)e, rt_array_get(&out.x, e),
                  rt_array_get(&out.ref, e));
  double eo = tl_pair_err(&out), el = tl_pair_err(&lse);
  fprintf(stderr, "  %s bf16 E 128 identity p 0.3: same zeros; out %.2g lse %.2g\n",
          flex_backend_name(dev), eo, el);
  ck_assert_msg(eo < td->tol && el < td->tol, "out %g lse %g (tol %g)", eo, el, td->tol);
  TlPair *all[] = {&q, &kk, &v, &out, &lse};
  for (int i = 0; i < 5; i++) tl_pair_free(all[i]);
  flex_kernel_free(k);
}
END_TEST

/* A sample and what it needs. */
typedef struct Sample {
  const char *path, *buffer;
  int nb;    /* second dim of the buffer [H, nb]; 0: [H] */
  bool grad; /* the buffer is `grad` */
} Sample;

static const Sample samples[] = {
    {"samples/causal.score", NULL, 0, false},
    {"samples/alibi.score", "slopes", 0, false},
    {"samples/relpos_bias.score", "rel_bias", 33, true},
};

/* Forward then backward of sample si in dtype td on both backends. */
static void run_case(int si, const TlDtype *td) {
  const Sample *sm = &samples[si];
  DLDataType dt = rt_dtype(td->code, td->bits), f32 = rt_dtype(kDLFloat, 32);
  enum { B = 2, H = 4, HKV = 2, QL = 23, KL = 37, E = 24 };
  flex_kernel *k = load(sm->path, NULL);
  int64_t qs[4] = {B, H, QL, E}, ks[4] = {B, HKV, KL, E}, ls[3] = {B, H, QL}, bs[2] = {H, sm->nb};
  TlPair q, kk, v, dout, out, lse, dlse, dq, dk, dv, grad;
  tl_pair_init(&q, dt, 4, qs, true, &rng), tl_pair_init(&kk, dt, 4, ks, true, &rng);
  tl_pair_init(&v, dt, 4, ks, true, &rng), tl_pair_init(&dout, dt, 4, qs, true, &rng);
  tl_pair_init(&out, dt, 4, qs, false, &rng), tl_pair_init(&lse, f32, 3, ls, false, &rng);
  tl_pair_init(&dlse, f32, 3, ls, true, &rng), tl_pair_init(&dq, dt, 4, qs, false, &rng);
  tl_pair_init(&dk, dt, 4, ks, false, &rng), tl_pair_init(&dv, dt, 4, ks, false, &rng);
  memset(&grad, 0, sizeof grad);
  RtArray buf = {0};
  DLTensor tbuf;
  flex_buffer fb[2];
  if (sm->buffer) {
    rt_array_init(&buf, f32, sm->nb ? 2 : 1, bs);
    for (int64_t i = 0; i < rt_array_count(&buf); i++)
      rt_array_set(&buf, i, sm->nb ? 0.5 * tl_normal(&rng) : 0.05 + 0.5 * tl_uniform(&rng));
    tbuf = rt_array_tensor(&buf);
    tl_pair_init(&grad, f32, sm->nb ? 2 : 1, bs, false, &rng);
    fb[0] = (flex_buffer){sm->buffer, &tbuf, sm->grad ? &grad.tx : NULL};
    fb[1] = (flex_buffer){sm->buffer, &tbuf, sm->grad ? &grad.tref : NULL};
  }
  flex_args a = {0}, r = {0};
  a.backend = dev, r.backend = FLEX_BACKEND_REFERENCE;
  a.q = &q.tx, a.k = &kk.tx, a.v = &v.tx, a.out = &out.tx, a.lse = &lse.tx;
  r.q = &q.tref, r.k = &kk.tref, r.v = &v.tref, r.out = &out.tref, r.lse = &lse.tref;
  if (sm->buffer) a.buffers = &fb[0], r.buffers = &fb[1], a.nbuffers = r.nbuffers = 1;
  uint64_t seed = tl_rand(&rng), off = tl_rand(&rng);
  set_dropout(&a, 0.25f, seed, off), set_dropout(&r, 0.25f, seed, off);
  ck_assert_msg(flex_forward(k, &r) == FLEX_OK, "reference: %s", flex_last_error());
  ck_assert_msg(tl_call(k, &a, false) == FLEX_OK, "%s: %s", flex_backend_name(dev), flex_last_error());
  double eo = tl_pair_err(&out), el = tl_pair_err(&lse);
  /* The backward gets the same O and LSE on both sides: the reference's,
   * rounded to what the kernels read, so the comparison measures it alone. */
  TlPair *ol[] = {&out, &lse};
  for (int j = 0; j < 2; j++)
    for (int64_t i = 0; i < rt_array_count(&ol[j]->x); i++) {
      rt_array_set(&ol[j]->x, i, rt_array_get(&ol[j]->ref, i));
      rt_array_set(&ol[j]->ref, i, rt_array_get(&ol[j]->x, i));
    }
  a.dout = &dout.tx, a.dlse = &dlse.tx, a.dq = &dq.tx, a.dk = &dk.tx, a.dv = &dv.tx;
  r.dout = &dout.tref, r.dlse = &dlse.tref, r.dq = &dq.tref, r.dk = &dk.tref, r.dv = &dv.tref;
  ck_assert_msg(flex_backward(k, &r) == FLEX_OK, "reference backward: %s", flex_last_error());
  ck_assert_msg(tl_call(k, &a, true) == FLEX_OK, "%s backward: %s", flex_backend_name(dev), flex_last_error());
  double eq = tl_pair_err(&dq), ek = tl_pair_err(&dk), ev = tl_pair_err(&dv);
  double eg = sm->grad ? tl_pair_err(&grad) : 0.0;
  fprintf(stderr, "  %s %s %s p 0.25: out %.2g lse %.2g; dq %.2g dk %.2g dv %.2g grad %.2g\n",
          flex_backend_name(dev), sm->path, td->name, eo, el, eq, ek, ev, eg);
  ck_assert_msg(eo < td->tol && el < td->tol, "%s %s: out %g lse %g (tol %g)", sm->path, td->name,
                eo, el, td->tol);
  ck_assert_msg(eq < td->gtol && ek < td->gtol && ev < td->gtol && eg < td->gtol,
                "%s %s: dq %g dk %g dv %g grad %g (tol %g)", sm->path, td->name, eq, ek, ev, eg,
                td->gtol);
  TlPair *all[] = {&q, &kk, &v, &dout, &out, &lse, &dlse, &dq, &dk, &dv};
  for (int i = 0; i < 10; i++) tl_pair_free(all[i]);
  if (sm->buffer) rt_array_free(&buf), tl_pair_free(&grad);
  flex_kernel_free(k);
}

/* _i = sample * 3 + dtype. */
START_TEST(against_reference) { run_case(_i / 3, &tl_dtypes[_i % 3]); }
END_TEST

/* p = 0 with a seed and an offset set: bitwise the output without dropout
 * (the kernels are generated without dropout code). _i: dtype. */
START_TEST(p_zero_is_no_dropout) {
  const TlDtype *td = &tl_dtypes[_i];
  DLDataType dt = rt_dtype(td->code, td->bits), f32 = rt_dtype(kDLFloat, 32);
  enum { B = 1, H = 2, HKV = 1, QL = 19, KL = 33, E = 16 };
  flex_kernel *k = load("samples/causal.score", NULL);
  int64_t qs[4] = {B, H, QL, E}, ks[4] = {B, HKV, KL, E}, ls[3] = {B, H, QL};
  TlPair q, kk, v, out[2], lse[2];
  tl_pair_init(&q, dt, 4, qs, true, &rng), tl_pair_init(&kk, dt, 4, ks, true, &rng);
  tl_pair_init(&v, dt, 4, ks, true, &rng);
  for (int t = 0; t < 2; t++) {
    tl_pair_init(&out[t], dt, 4, qs, false, &rng), tl_pair_init(&lse[t], f32, 3, ls, false, &rng);
    flex_args a = {0};
    a.backend = dev;
    a.q = &q.tx, a.k = &kk.tx, a.v = &v.tx, a.out = &out[t].tx, a.lse = &lse[t].tx;
    if (t) set_dropout(&a, 0.0f, 12345, 678);
    ck_assert_msg(tl_call(k, &a, false) == FLEX_OK, "%s: %s", flex_backend_name(dev), flex_last_error());
  }
  ck_assert(memcmp(out[0].x.data, out[1].x.data, (size_t)rt_array_count(&out[0].x) * td->bits / 8) == 0);
  ck_assert(memcmp(lse[0].x.data, lse[1].x.data, (size_t)rt_array_count(&lse[0].x) * 4) == 0);
  TlPair *all[] = {&q, &kk, &v, &out[0], &out[1], &lse[0], &lse[1]};
  for (int i = 0; i < 7; i++) tl_pair_free(all[i]);
  flex_kernel_free(k);
}
END_TEST

/* Every test of a backend (n = 0: left out). */
#define DROPOUT_TESTS(n)                                                                        \
  TL_LOOP(same_dropped_elements, 3 * (n)), TL_LOOP(packed_dropped_elements, 2 * (n)),            \
      TL_LOOP(wide_head_dim, (n)), TL_LOOP(against_reference, 3 * 3 * (n)),                     \
      TL_LOOP(p_zero_is_no_dropout, 3 * (n))

int main(int argc, char **argv) {
  rng = tl_seed();
  int rc = tl_cuda_mode(argc, argv);
  if (rc >= 0) {
    dev = FLEX_BACKEND_CUDA;
    return rc ? rc : TL_MAIN("cuda_dropout", 0, TL_CASE("cuda", 0), DROPOUT_TESTS(1));
  }
  int n = flex_backend_available(FLEX_BACKEND_CPU);
  if (!n)
    fprintf(stderr, "cpu backend not in this build: its dropout tests skipped (%s)\n", flex_last_error());
  tl_one_process(); /* the emulator's modules serve several tests */
  return TL_MAIN("emu_dropout", 0, TL_CASE("dropout", 300), DROPOUT_TESTS(1),
                 TL_FIXTURE("cpu", 300, use_cpu, NULL), DROPOUT_TESTS(n));
}
