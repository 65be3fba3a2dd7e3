/* `flexc run` end to end: the binary ($FLEXC_BIN) on .npy files written
 * here. The success path is compared with the library's reference on the
 * same (fp32-cast) inputs; every user error exits 1 with a message that
 * names the problem, bad usage exits 2, and nothing dies of a signal. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/npy.h"
#include "runtime/rt.h"
#include "testlib.h"

static char dir[64];

/* Write a random float array to DIR/name. */
static void write_random(const char *name, DLDataType dt, int nd, const int64_t *shape, uint64_t *seed) {
  RtArray a;
  rt_array_init(&a, dt, nd, shape);
  for (int64_t i = 0; i < rt_array_count(&a); i++) rt_array_set(&a, i, tl_normal(seed));
  char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  ck_assert_msg(rt_npy_write(path, &a) == 0, "%s", flex_last_error());
  rt_array_free(&a);
}

static void setup(void) {
  snprintf(dir, sizeof dir, "/tmp/flexc_run_%d", (int)getpid());
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", dir, dir);
  ck_assert_int_eq(system(cmd), 0);
  uint64_t seed = tl_seed();
  int64_t q[4] = {1, 4, 7, 12}, k[4] = {1, 2, 11, 12}, v[4] = {1, 2, 11, 5}, o[4] = {1, 4, 7, 5};
  int64_t kbad[4] = {1, 2, 11, 13}, bias[2] = {4, 11};
  write_random("q.npy", rt_dtype(kDLFloat, 64), 4, q, &seed);
  write_random("k.npy", rt_dtype(kDLFloat, 32), 4, k, &seed);
  write_random("v.npy", rt_dtype(kDLFloat, 16), 4, v, &seed);
  write_random("do.npy", rt_dtype(kDLFloat, 32), 4, o, &seed);
  write_random("kbad.npy", rt_dtype(kDLFloat, 32), 4, kbad, &seed);
  write_random("bias.npy", rt_dtype(kDLFloat, 32), 2, bias, &seed);
  /* Head dims TMA can load (rows of 16-byte multiples): the sm_90a forward. */
  int64_t q16[4] = {1, 4, 70, 16}, k16[4] = {1, 2, 133, 16}, v16[4] = {1, 2, 133, 8};
  write_random("q16.npy", rt_dtype(kDLFloat, 32), 4, q16, &seed);
  write_random("k16.npy", rt_dtype(kDLFloat, 32), 4, k16, &seed);
  write_random("v16.npy", rt_dtype(kDLFloat, 32), 4, v16, &seed);
  int64_t o16[4] = {1, 4, 70, 8};
  write_random("do16.npy", rt_dtype(kDLFloat, 32), 4, o16, &seed);
  char path[512];
  snprintf(path, sizeof path, "%s/garbage.npy", dir);
  FILE *f = fopen(path, "wb");
  fputs("this is not an array", f);
  fclose(f);
}

static void teardown(void) {
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd)) fprintf(stderr, "could not remove %s\n", dir);
}

/* Run flexc run on a sample with extra arguments; returns the exit status. */
static int run(const char *sample, const char *extra, Buf *out) {
  Buf cmd = {0};
  buf_printf(&cmd, "%s run %s --q %s/q.npy --v %s/v.npy %s", tl_flexc(), tl_src_path(sample), dir,
             dir, extra);
  int st = tl_run(cmd.data, out);
  buf_free(&cmd);
  ck_assert_msg(st >= 0 && st < 128, "flexc died (status %d): %s", st, out->data);
  return st;
}

static void read_npy(const char *name, RtArray *a) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  ck_assert_msg(rt_npy_read(path, a) == 0, "%s", flex_last_error());
}

/* The same call in-process on fp32-cast inputs, compared with out.npy. */
static void compare_with_library(void) {
  const char *files[3] = {"q.npy", "k.npy", "v.npy"};
  RtArray in[3], out, lse, ref_out, ref_lse;
  DLTensor t[3];
  for (int i = 0; i < 3; i++) {
    RtArray raw;
    read_npy(files[i], &raw);
    rt_array_init(&in[i], rt_dtype(kDLFloat, 32), raw.ndim, raw.shape);
    for (int64_t j = 0; j < rt_array_count(&raw); j++) rt_array_set(&in[i], j, rt_array_get(&raw, j));
    rt_array_free(&raw);
    t[i] = rt_array_tensor(&in[i]);
  }
  read_npy("out/out.npy", &out);
  read_npy("out/lse.npy", &lse);
  ck_assert(out.dtype.code == kDLFloat && out.dtype.bits == 64 && out.ndim == 4);
  rt_array_init(&ref_out, rt_dtype(kDLFloat, 64), 4, out.shape);
  rt_array_init(&ref_lse, rt_dtype(kDLFloat, 64), 3, lse.shape);
  for (int64_t i = 0; i < rt_array_count(&ref_out); i++) rt_array_set(&ref_out, i, NAN);
  for (int64_t i = 0; i < rt_array_count(&ref_lse); i++) rt_array_set(&ref_lse, i, NAN);
  DLTensor to = rt_array_tensor(&ref_out), tl = rt_array_tensor(&ref_lse);
  flex_kernel *k = tl_load("samples/softcap.score", NULL, NULL);
  flex_args a;
  memset(&a, 0, sizeof a);
  a.q = &t[0], a.k = &t[1], a.v = &t[2], a.out = &to, a.lse = &tl;
  ck_assert_msg(flex_forward(k, &a) == FLEX_OK, "%s", flex_last_error());
  /* The CLI's files against the library's own call on the same inputs. */
  double eo = tl_rel_err(&out, &ref_out), el = tl_rel_err(&lse, &ref_lse);
  ck_assert_msg(eo < 1e-14 && el < 1e-14, "out %g lse %g", eo, el);
  flex_kernel_free(k);
  RtArray *all[] = {&in[0], &in[1], &in[2], &out, &lse, &ref_out, &ref_lse};
  for (size_t i = 0; i < 7; i++) rt_array_free(all[i]);
}

START_TEST(success_paths) {
  Buf out = {0};
  char extra[1024];
  snprintf(extra, sizeof extra, "--k %s/k.npy --dout %s/do.npy --out %s/out", dir, dir, dir);
  ck_assert_msg(run("samples/softcap.score", extra, &out) == 0, "%s", out.data);
  ck_assert_msg(strstr(out.data, "reference"), "%s", out.data);
  const char *files[] = {"out/out.npy", "out/lse.npy", "out/dq.npy", "out/dk.npy", "out/dv.npy"};
  for (size_t i = 0; i < 5; i++) {
    RtArray a;
    read_npy(files[i], &a);
    for (int64_t j = 0; j < rt_array_count(&a); j++) ck_assert(isfinite(rt_array_get(&a, j)));
    rt_array_free(&a);
  }
  compare_with_library();
  buf_free(&out);
  /* A grad buffer writes d_NAME.npy of the buffer's shape. */
  Buf out2 = {0};
  snprintf(extra, sizeof extra, "--k %s/k.npy --dout %s/do.npy --buffer rel_bias=%s/bias.npy --out %s/out2 --dtype bf16",
           dir, dir, dir, dir);
  ck_assert_msg(run("samples/relpos_bias.score", extra, &out2) == 0, "%s", out2.data);
  RtArray g;
  read_npy("out2/d_rel_bias.npy", &g);
  ck_assert(g.ndim == 2 && g.shape[0] == 4 && g.shape[1] == 11);
  rt_array_free(&g);
  buf_free(&out2);
}
END_TEST

/* Relative norm error of DIR/a against DIR/b over every element; NaN or a
 * shape mismatch never passes. */
static double file_err(const char *a, const char *b) {
  RtArray x, r;
  read_npy(a, &x);
  read_npy(b, &r);
  ck_assert_msg(x.ndim == r.ndim && rt_array_count(&x) == rt_array_count(&r), "%s vs %s", a, b);
  for (int d = 0; d < x.ndim; d++) ck_assert_int_eq(x.shape[d], r.shape[d]);
  bool zero = true; /* tl_rel_err fails an all-zero reference too; this names it */
  for (int64_t i = 0; i < rt_array_count(&r); i++) zero &= rt_array_get(&r, i) == 0;
  double e = tl_rel_err(&x, &r); /* equal infinities: fully masked rows, lse = -inf */
  rt_array_free(&x);
  rt_array_free(&r);
  ck_assert_msg(!zero, "%s is all zeros", b);
  return e;
}

/* --backend emu through the CLI, float32 files, against a reference run on
 * the same files (both cast the inputs to --dtype first). */
static void emu_vs_reference(const char *dtype, double tol, double gtol) {
  const char *backends[2] = {"emu", "reference"};
  for (int i = 0; i < 2; i++) {
    char extra[1024];
    snprintf(extra, sizeof extra,
             "--k %s/k.npy --dout %s/do.npy --buffer rel_bias=%s/bias.npy --dtype %s "
             "--backend %s --out %s/%s_%s",
             dir, dir, dir, dtype, backends[i], dir, backends[i], dtype);
    Buf out = {0};
    ck_assert_msg(run("samples/relpos_bias.score", extra, &out) == 0, "%s", out.data);
    ck_assert_msg(strstr(out.data, backends[i]), "%s", out.data);
    buf_free(&out);
  }
  const char *files[] = {"out", "lse", "dq", "dk", "dv", "d_rel_bias"};
  for (int i = 0; i < 6; i++) {
    char a[128], b[128];
    snprintf(a, sizeof a, "emu_%s/%s.npy", dtype, files[i]);
    snprintf(b, sizeof b, "reference_%s/%s.npy", dtype, files[i]);
    RtArray x;
    read_npy(a, &x);
    ck_assert_msg(x.dtype.code == kDLFloat && x.dtype.bits == 32, "%s is not float32", a);
    rt_array_free(&x);
    double e = file_err(a, b), lim = i < 2 ? tol : gtol;
    fprintf(stderr, "  emu %s %s: rel. error %.2e\n", dtype, files[i], e);
    ck_assert_msg(e < lim, "%s: relative error %g over %g", a, e, lim);
  }
}

START_TEST(emu_backend) {
  emu_vs_reference("fp32", 1e-4, 1e-3);
  emu_vs_reference("fp16", 5e-3, 2e-2);
}
END_TEST

/* --kv-splits N reaches the call: a decoding shape (one query, 200 keys:
 * 7 fp32 key tiles) split 3 ways on the emulator against the reference,
 * and a negative count is a user error naming the option. */
START_TEST(kv_splits_option) {
  uint64_t seed = tl_seed();
  int64_t q[4] = {1, 4, 1, 12}, k[4] = {1, 2, 200, 12}, v[4] = {1, 2, 200, 5};
  write_random("dq.npy", rt_dtype(kDLFloat, 32), 4, q, &seed);
  write_random("dk.npy", rt_dtype(kDLFloat, 32), 4, k, &seed);
  write_random("dv.npy", rt_dtype(kDLFloat, 32), 4, v, &seed);
  const char *backends[2] = {"emu --kv-splits 3", "reference --kv-splits 3"};
  for (int i = 0; i < 2; i++) {
    Buf cmd = {0}, out = {0};
    buf_printf(&cmd, "%s run %s --q %s/dq.npy --k %s/dk.npy --v %s/dv.npy --backend %s --out %s/ks%d",
               tl_flexc(), tl_src_path("samples/causal_lower_right.score"), dir, dir, dir,
               backends[i], dir, i);
    ck_assert_msg(tl_run(cmd.data, &out) == 0, "%s", out.data);
    buf_free(&cmd), buf_free(&out);
  }
  double eo = file_err("ks0/out.npy", "ks1/out.npy"), el = file_err("ks0/lse.npy", "ks1/lse.npy");
  fprintf(stderr, "  emu --kv-splits 3: out %.2e lse %.2e\n", eo, el);
  ck_assert_msg(eo < 1e-4 && el < 1e-4, "out %g lse %g", eo, el);
  Buf out = {0};
  char extra[1024];
  snprintf(extra, sizeof extra, "--k %s/k.npy --backend emu --kv-splits -2 --out %s/ks", dir, dir);
  ck_assert_int_eq(run("samples/causal.score", extra, &out), 1);
  ck_assert_msg(strstr(out.data, "--kv-splits") && strstr(out.data, "-2"), "%s", out.data);
  buf_free(&out);
}
END_TEST

/* --arch sm_90a on the emulator (the TMA + wgmma forward and backward)
 * against the reference on the same files. */
START_TEST(emu_arch_sm90a) {
  const char *backends[2] = {"emu", "reference"};
  for (int i = 0; i < 2; i++) {
    Buf cmd = {0}, out = {0};
    buf_printf(&cmd, "%s run %s --q %s/q16.npy --k %s/k16.npy --v %s/v16.npy --dout %s/do16.npy "
               "--dtype fp16 --backend %s%s --out %s/arch_%s", tl_flexc(),
               tl_src_path("samples/causal.score"), dir, dir, dir, dir, backends[i],
               i ? "" : " --arch sm_90a", dir, backends[i]);
    ck_assert_msg(tl_run(cmd.data, &out) == 0, "%s", out.data);
    buf_free(&cmd);
    buf_free(&out);
  }
  const char *files[] = {"out", "lse", "dq", "dk", "dv"};
  for (int i = 0; i < 5; i++) {
    char a[128], b[128];
    snprintf(a, sizeof a, "arch_emu/%s.npy", files[i]);
    snprintf(b, sizeof b, "arch_reference/%s.npy", files[i]);
    double e = file_err(a, b), tol = i < 2 ? 5e-3 : 2e-2; /* fp16: forward, gradients */
    fprintf(stderr, "  emu --arch sm_90a %s: rel. error %.2e\n", files[i], e);
    ck_assert_msg(e < tol, "%s: relative error %g over %g", a, e, tol);
  }
}
END_TEST

/* --fast-math builds and runs on the emulator for every approximated
 * builtin (the emulator stands in exact values for the approximations, so
 * the results must match the reference at fp32 tolerance). */
START_TEST(fast_math_emu) {
  char path[512];
  snprintf(path, sizeof path, "%s/fast.score", dir);
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fputs("score f(s, b, h, q, kv) {\n"
        "  let t = 20.0 * tanh(s / 20.0) + 0.3 * sin(float(q - kv)) + 0.2 * cos(s);\n"
        "  return t + 0.1 * log(1.0 + exp(s)) + 0.05 * log2(2.0 + sigmoid(s)) + 0.1 * pow(sigmoid(s), 1.5);\n"
        "}\n", f);
  fclose(f);
  const char *backends[2] = {"emu", "reference"};
  for (int i = 0; i < 2; i++) {
    Buf cmd = {0}, out = {0};
    buf_printf(&cmd, "%s run %s --q %s/q.npy --k %s/k.npy --v %s/v.npy --dout %s/do.npy --fast-math "
               "--backend %s --out %s/fast_%s", tl_flexc(), path, dir, dir, dir, dir, backends[i], dir,
               backends[i]);
    ck_assert_msg(tl_run(cmd.data, &out) == 0, "%s", out.data);
    buf_free(&cmd);
    buf_free(&out);
  }
  const char *files[] = {"out", "lse", "dq", "dk", "dv"};
  for (int i = 0; i < 5; i++) {
    char a[128], b[128];
    snprintf(a, sizeof a, "fast_emu/%s.npy", files[i]);
    snprintf(b, sizeof b, "fast_reference/%s.npy", files[i]);
    double e = file_err(a, b), lim = i < 2 ? 1e-4 : 1e-3;
    fprintf(stderr, "  emu --fast-math %s: rel. error %.2e\n", files[i], e);
    ck_assert_msg(e < lim, "%s: relative error %g over %g", a, e, lim);
  }
}
END_TEST

/* --repeat N makes the call N times and prints the medians; the files are
 * the same call's results (the reference is deterministic: bit for bit).
 * --threads sizes the cpu backend's pool, whose results stay within fp32
 * tolerance of the reference's. */
START_TEST(repeat_and_threads) {
  const char *runs[3][2] = {{"--backend reference", "ref1"},
                            {"--backend reference --repeat 3", "ref3"},
                            {"--backend cpu --threads 1 --repeat 2", "cpu1"}};
  int n = flex_backend_available(FLEX_BACKEND_CPU) ? 3 : 2;
  for (int i = 0; i < n; i++) {
    char extra[1024];
    snprintf(extra, sizeof extra, "--k %s/k.npy --dout %s/do.npy %s --out %s/%s", dir, dir,
             runs[i][0], dir, runs[i][1]);
    Buf out = {0};
    ck_assert_msg(run("samples/softcap.score", extra, &out) == 0, "%s", out.data);
    bool medians = strstr(out.data, "medians of") != NULL;
    ck_assert_msg(medians == (i > 0), "%s", out.data);
    ck_assert_msg(i != 1 || strstr(out.data, "(medians of 3 calls)"), "%s", out.data);
    buf_free(&out);
  }
  const char *files[] = {"out", "lse", "dq", "dk", "dv"};
  for (int i = 0; i < 5; i++)
    for (int j = 1; j < n; j++) {
      char a[128], b[128];
      snprintf(a, sizeof a, "%s/%s.npy", runs[j][1], files[i]);
      snprintf(b, sizeof b, "ref1/%s.npy", files[i]);
      double e = file_err(a, b), lim = j == 1 ? 0 : i < 2 ? 1e-4 : 1e-3;
      ck_assert_msg(e <= lim, "%s: relative error %g over %g", a, e, lim);
    }
}
END_TEST

/* Whether two .npy files hold the same bytes. */
static bool same_file(const char *a, const char *b) {
  RtArray x, y;
  read_npy(a, &x);
  read_npy(b, &y);
  size_t n = (size_t)rt_array_count(&x) * (x.dtype.bits / 8);
  bool same = rt_array_count(&x) == rt_array_count(&y) && x.dtype.bits == y.dtype.bits &&
              !memcmp(x.data, y.data, n);
  rt_array_free(&x);
  rt_array_free(&y);
  return same;
}

/* --deterministic: the cpu backend with one thread and with two, and the
 * emulator with two CTA orders, give bitwise the same gradient files, all
 * within tolerance of the reference; without it the files are compared
 * and the outcome printed (float sums in another order usually differ). */
START_TEST(deterministic) {
  uint64_t seed = tl_seed();
  int64_t q[4] = {1, 4, 128, 32}, k[4] = {1, 2, 192, 32}, bias[2] = {4, 33};
  write_random("dq_q.npy", rt_dtype(kDLFloat, 32), 4, q, &seed);
  write_random("dq_k.npy", rt_dtype(kDLFloat, 32), 4, k, &seed);
  write_random("dq_v.npy", rt_dtype(kDLFloat, 32), 4, k, &seed);
  write_random("dq_do.npy", rt_dtype(kDLFloat, 32), 4, q, &seed);
  write_random("dq_bias.npy", rt_dtype(kDLFloat, 32), 2, bias, &seed);
  const struct {
    const char *name, *env, *backend, *flag;
  } runs[] = {{"cpu1", "FLEXC_THREADS=1", "cpu", "--deterministic"},
              {"cpu2", "FLEXC_THREADS=2", "cpu", "--deterministic"},
              {"emu3", "FLEXC_THREADS=2 FLEXC_EMU_SHUFFLE=3", "emu", "--deterministic"},
              {"emu5", "FLEXC_THREADS=2 FLEXC_EMU_SHUFFLE=5", "emu", "--deterministic"},
              {"acpu1", "FLEXC_THREADS=1", "cpu", ""},
              {"acpu2", "FLEXC_THREADS=2", "cpu", ""},
              {"ref", "", "reference", "--deterministic"}};
  enum { NRUNS = sizeof runs / sizeof *runs };
  bool cpu = flex_backend_available(FLEX_BACKEND_CPU);
  for (int i = 0; i < NRUNS; i++) {
    if (!cpu && !strcmp(runs[i].backend, "cpu")) continue;
    Buf cmd = {0}, out = {0};
    buf_printf(&cmd, "env %s %s run %s --q %s/dq_q.npy --k %s/dq_k.npy --v %s/dq_v.npy "
               "--dout %s/dq_do.npy --buffer rel_bias=%s/dq_bias.npy --backend %s %s --out %s/det_%s",
               runs[i].env, tl_flexc(), tl_src_path("samples/relpos_bias.score"), dir, dir, dir, dir,
               dir, runs[i].backend, runs[i].flag, dir, runs[i].name);
    ck_assert_msg(tl_run(cmd.data, &out) == 0, "%s: %s", cmd.data, out.data);
    buf_free(&cmd);
    buf_free(&out);
  }
  const char *files[] = {"dq", "dk", "dv", "d_rel_bias"};
  for (int f = 0; f < 4; f++) {
    char a[128], b[128], r[128];
    snprintf(r, sizeof r, "det_ref/%s.npy", files[f]);
    for (int i = 0; i < 4; i += 2) {
      if (!cpu && i == 0) continue;
      snprintf(a, sizeof a, "det_%s/%s.npy", runs[i].name, files[f]);
      snprintf(b, sizeof b, "det_%s/%s.npy", runs[i + 1].name, files[f]);
      ck_assert_msg(same_file(a, b), "--deterministic: %s and %s differ", a, b);
      double e = file_err(a, r);
      ck_assert_msg(e < 1e-3, "%s: relative error %g against the reference", a, e);
    }
    if (cpu) {
      snprintf(a, sizeof a, "det_acpu1/%s.npy", files[f]);
      snprintf(b, sizeof b, "det_acpu2/%s.npy", files[f]);
      fprintf(stderr, "  without --deterministic, cpu 1 vs 2 threads: %s %s\n", files[f],
              same_file(a, b) ? "same bits" : "bits differ");
    }
  }
}
END_TEST

/* Each failing command and a piece of the message it must print. */
START_TEST(user_errors) {
  struct { const char *sample, *fmt, *want; int status; } cases[] = {
      {"samples/softcap.score", "--k %s/garbage.npy --out %s/o", "garbage.npy", 1},
      {"samples/softcap.score", "--k %s/kbad.npy --out %s/o", "head dim", 1},
      {"samples/relpos_bias.score", "--k %s/k.npy --out %s/o", "rel_bias", 1},
      {"samples/softcap.score", "--k %s/k.npy --param nope=1 --out %s/o", "unknown param 'nope'", 1},
      {"samples/softcap.score", "--k %s/k.npy --kernel nope --out %s/o", "nope", 1},
      {"samples/softcap.score", "--k %s/k.npy --buffer zz=%s/bias.npy --out %s/o", "unknown buffer 'zz'", 1},
      {"samples/softcap.score", "--k %s/missing.npy --out %s/o", "missing.npy", 1},
      {"samples/softcap.score", "--k %s/k.npy --dtype fp8 --out %s/o", "--dtype", 2},
      {"samples/softcap.score", "--k %s/k.npy", "--out", 2},
      {"samples/softcap.score", "--k %s/k.npy --repeat 0 --out %s/o", "--repeat must be an integer", 1},
      {"samples/softcap.score", "--k %s/k.npy --threads 2x --out %s/o", "--threads must be an integer", 1},
      {"samples/softcap.score", "--k %s/k.npy --arch sm_99 --out %s/o", "--arch", 2},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char extra[1024];
    snprintf(extra, sizeof extra, cases[i].fmt, dir, dir, dir);
    Buf out = {0};
    int st = run(cases[i].sample, extra, &out);
    ck_assert_msg(st == cases[i].status && strstr(out.data, cases[i].want),
                  "case %zu: status %d, output: %s", i, st, out.data);
    buf_free(&out);
  }
}
END_TEST

int main(void) {
  return TL_MAIN("run", 0, TL_FIXTURE("run", 60, setup, teardown), TL_TEST(success_paths),
                 TL_TEST(user_errors), TL_TEST(repeat_and_threads), TL_TEST(emu_backend),
                 TL_TEST(fast_math_emu), TL_TEST(kv_splits_option), TL_TEST(deterministic),
                 TL_TEST(emu_arch_sm90a));
}
