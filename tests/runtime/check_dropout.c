/* Dropout's bits (kernels/philox.cuh, docs/language.md "Dropout"): Philox4x32-10
 * against the published known-answer vectors of Random123, the kept
 * fraction over 10^6 elements for a few p, the reference's forward
 * against the rule written out here, and the `flexc run` options (the
 * backends against the reference: tests/emu/check_emu_dropout.c). Fresh random inputs every run. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/philox.cuh"
#include "runtime/npy.h"
#include "testlib.h"

/* Random123's kat_vectors for philox4x32_10: counter, key, result. */
START_TEST(philox_known_answers) {
  static const uint32_t kat[3][10] = {
      {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
      {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d,
       0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
      {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09,
       0x94fdcceb, 0x5001e420, 0x24126ea1},
  };
  for (int t = 0; t < 3; t++) {
    uint32_t c[4] = {kat[t][0], kat[t][1], kat[t][2], kat[t][3]};
    flex_philox4x32_10(c, kat[t][4], kat[t][5]);
    for (int w = 0; w < 4; w++)
      ck_assert_msg(c[w] == kat[t][6 + w], "vector %d word %d: %08x, expected %08x", t, w, c[w],
                    kat[t][6 + w]);
  }
  /* The dropout layout: counter (j >> 2, i, bh, offset_lo + offset_hi), key (seed_lo, seed_hi). */
  uint32_t r[4];
  flex_dropout_words(r, 0xa4093822, 0x299f31d0, flex_dropout_ctr3(0x0370734300000001ull), 0x13198a2e,
                     0x85a308d3, 0x243f6a88);
  for (int w = 0; w < 4; w++) ck_assert_uint_eq(r[w], kat[2][6 + w]);
  ck_assert_uint_eq(flex_dropout_ctr3(0x0000000500000007ull), 12);
  ck_assert_uint_eq(flex_dropout_ctr3(0xffffffff00000002ull), 1); /* 32-bit wrap */
  ck_assert_uint_eq(flex_dropout_word((const uint32_t[4]){1, 2, 3, 4}, 2), 3);
}
END_TEST

/* Over 10^6 elements (i, j) of a few heads the kept fraction is within
 * 0.3% (of the elements: 0.003 absolute) of 1 - p. The binomial standard
 * deviation is sqrt(p (1 - p) / 10^6) <= 0.0005, so that is 6 sigma or
 * more; 0.3% relative to 1 - p would be one sigma at p = 0.9 and fail
 * every third seed. */
START_TEST(kept_fraction) {
  uint64_t rng = tl_seed();
  static const float ps[] = {0.1f, 0.25f, 0.5f, 0.9f};
  for (size_t k = 0; k < sizeof ps / sizeof ps[0]; k++) {
    uint64_t seed = tl_rand(&rng), off = tl_rand(&rng);
    long kept = 0, n = 0;
    for (uint32_t bh = 0; bh < 4; bh++)
      for (uint32_t i = 0; i < 250; i++)
        for (uint32_t j4 = 0; j4 < 250; j4++) {
          uint32_t r[4];
          flex_dropout_words(r, (uint32_t)seed, (uint32_t)(seed >> 32), flex_dropout_ctr3(off), bh,
                             i, j4);
          for (int w = 0; w < 4; w++, n++) kept += flex_dropout_keep(r[w], ps[k]);
        }
    double frac = (double)kept / (double)n, want = 1.0 - ps[k];
    fprintf(stderr, "  p %.2f: kept %.5f of %ld (want %.2f)\n", ps[k], frac, n, want);
    ck_assert_int_eq(n, 1000000);
    ck_assert_msg(fabs(frac - want) < 0.003, "p %g: kept %.5f, want %.5f within 0.003",
                  ps[k], frac, want);
  }
  /* The threshold is u >= p on u = (r >> 8) 2^-24: r >> 8 == 2^23 is u = 0.5. */
  ck_assert(flex_dropout_keep(0x80000000u, 0.5f));
  ck_assert(!flex_dropout_keep(0x7fffffffu, 0.5f));
  ck_assert(flex_dropout_keep(0u, 0.0f));
}
END_TEST

/* Host float64 tensors of one small call on the reference. */
typedef struct Call {
  TlArr q, k, v, out, lse;
  flex_args a;
} Call;

static const DLDataType F64 = {kDLFloat, 64, 1};

static void call_init(Call *c, int B, int H, int HKV, int QL, int KL, int E, uint64_t *rng) {
  memset(c, 0, sizeof *c);
  int64_t q[4] = {B, H, QL, E}, k[4] = {B, HKV, KL, E}, o[4] = {B, H, QL, E};
  tl_arr_init(&c->q, F64, 4, q), tl_arr_init(&c->k, F64, 4, k), tl_arr_init(&c->v, F64, 4, k);
  tl_arr_init(&c->out, F64, 4, o), tl_arr_init(&c->lse, F64, 3, o);
  tl_arr_normal(&c->q, rng), tl_arr_normal(&c->k, rng), tl_arr_normal(&c->v, rng);
  c->a.backend = FLEX_BACKEND_REFERENCE;
  c->a.q = &c->q.t, c->a.k = &c->k.t, c->a.v = &c->v.t, c->a.out = &c->out.t, c->a.lse = &c->lse.t;
}

static void call_free(Call *c) {
  TlArr *all[] = {&c->q, &c->k, &c->v, &c->out, &c->lse};
  for (int i = 0; i < 5; i++) tl_arr_free(all[i]);
}

/* The reference forward against the rule computed here: softmax P in
 * float64, O = sum_j P keep / (1 - p) V, LSE before dropout. */
START_TEST(reference_forward_rule) {
  uint64_t rng = tl_seed() + 1;
  flex_kernel *k;
  const char *src = "score ident(s, b, h, q, kv) { return s; }\n";
  ck_assert(flex_kernel_from_source(&k, "ident", src, strlen(src), NULL) == FLEX_OK);
  enum { B = 2, H = 4, HKV = 2, QL = 9, KL = 13, E = 5 };
  Call c, n;
  call_init(&c, B, H, HKV, QL, KL, E, &rng);
  c.a.dropout_p = 0.4f, c.a.dropout_seed = 0x0123456789abcdefull, c.a.dropout_offset = 77;
  ck_assert_msg(flex_forward(k, &c.a) == FLEX_OK, "%s", flex_last_error());
  call_init(&n, B, H, HKV, QL, KL, E, &rng); /* then the same inputs, without dropout */
  memcpy(n.q.a.data, c.q.a.data, sizeof(double) * B * H * QL * E);
  memcpy(n.k.a.data, c.k.a.data, sizeof(double) * B * HKV * KL * E);
  memcpy(n.v.a.data, c.v.a.data, sizeof(double) * B * HKV * KL * E);
  ck_assert(flex_forward(k, &n.a) == FLEX_OK);
  double *Q = c.q.a.data, *K = c.k.a.data, *V = c.v.a.data, *O = c.out.a.data;
  int dropped = 0;
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++)
      for (int i = 0; i < QL; i++) {
        const size_t row = ((size_t)(b * H + h) * QL + i);
        ck_assert(((double *)c.lse.a.data)[row] == ((double *)n.lse.a.data)[row]);
        double s[KL], mx = -INFINITY, sum = 0, o[E] = {0};
        for (int j = 0; j < KL; j++) {
          double d = 0;
          for (int e = 0; e < E; e++)
            d += Q[row * E + e] * K[((size_t)(b * HKV + h / 2) * KL + j) * E + e];
          s[j] = d / sqrt((double)E), mx = fmax(mx, s[j]);
        }
        for (int j = 0; j < KL; j++) sum += exp(s[j] - mx);
        for (int j = 0; j < KL; j++) {
          uint32_t r[4];
          flex_dropout_words(r, 0x89abcdefu, 0x01234567u, 77, (uint32_t)(b * H + h), (uint32_t)i,
                             (uint32_t)j >> 2);
          bool keep = (double)(r[j & 3] >> 8) / 16777216.0 >= 0.4f;
          dropped += !keep;
          for (int e = 0; e < E; e++)
            o[e] += keep ? exp(s[j] - mx) / sum / (1 - (double)0.4f) *
                               V[((size_t)(b * HKV + h / 2) * KL + j) * E + e] : 0;
        }
        for (int e = 0; e < E; e++)
          ck_assert_msg(fabs(O[row * E + e] - o[e]) < 1e-12, "b%d h%d i%d e%d: %.15g, want %.15g",
                        b, h, i, e, O[row * E + e], o[e]);
      }
  ck_assert_int_gt(dropped, 0);
  call_free(&c), call_free(&n);
  flex_kernel_free(k);
}
END_TEST

/* flexc run --dropout: the usage rules, and a run whose output differs from
 * the one without dropout and repeats with the same seed. */
START_TEST(cli_options) {
  char dir[] = "/tmp/flexc_dropout_XXXXXX";
  ck_assert_ptr_nonnull(mkdtemp(dir));
  Buf cmd = {0}, out = {0};
  uint64_t rng = tl_seed() + 3;
  int64_t shape[4] = {1, 2, 16, 8};
  TlArr x;
  tl_arr_init(&x, F64, 4, shape);
  const char *names[] = {"q", "k", "v"};
  for (int i = 0; i < 3; i++) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s.npy", dir, names[i]);
    tl_arr_normal(&x, &rng);
    ck_assert(rt_npy_write(path, &x.a) == FLEX_OK);
  }
  tl_arr_free(&x);
  struct { const char *opts, *sub; int status; } runs[] = {
      {"--dropout 0.5 --seed 7", "a", 0},          {"--dropout 0.5 --seed 7", "b", 0},
      {"--dropout 0.5 --seed 8", "c", 0},          {"", "d", 0},
      {"--dropout 1 --seed 7", "e", 1},            {"--dropout 0.5", "e", 2},
      {"--dropout 0.5 --seed -3", "e", 1},         {"--dropout x --seed 1", "e", 1},
      {"--dropout 0.5 --seed 7 --offset 0x10", "f", 0},
  };
  for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
    buf_free(&cmd);
    buf_printf(&cmd, "%s run %s --q %s/q.npy --k %s/k.npy --v %s/v.npy --backend reference %s --out %s/%s",
               tl_flexc(), tl_src_path("samples/causal.score"), dir, dir, dir, runs[r].opts, dir,
               runs[r].sub);
    int st = tl_run(cmd.data, &out);
    ck_assert_msg(st == runs[r].status, "%s: status %d: %s", cmd.data, st, out.data);
    if (st == 1) ck_assert_msg(strstr(out.data, "dropout") || strstr(out.data, "seed"), "%s", out.data);
    buf_free(&out);
  }
  RtArray o[5];
  const char *sub[] = {"a", "b", "c", "d", "f"};
  for (int i = 0; i < 5; i++) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s/out.npy", dir, sub[i]);
    ck_assert_msg(rt_npy_read(path, &o[i]) == FLEX_OK, "%s", flex_last_error());
  }
  size_t bytes = (size_t)rt_array_count(&o[0]) * 8;
  ck_assert(memcmp(o[0].data, o[1].data, bytes) == 0); /* same seed: same bits */
  ck_assert(memcmp(o[0].data, o[2].data, bytes) != 0);
  ck_assert(memcmp(o[0].data, o[3].data, bytes) != 0);
  ck_assert(memcmp(o[0].data, o[4].data, bytes) != 0); /* another offset */
  for (int i = 0; i < 5; i++) rt_array_free(&o[i]);
  buf_free(&cmd);
  buf_printf(&cmd, "rm -rf %s", dir);
  ck_assert_int_eq(system(cmd.data), 0);
  buf_free(&cmd);
}
END_TEST

int main(void) {
  return TL_MAIN("dropout", 0, TL_TEST(philox_known_answers), TL_TEST(kept_fraction),
                 TL_TEST(reference_forward_rule), TL_TEST(cli_options));
}
