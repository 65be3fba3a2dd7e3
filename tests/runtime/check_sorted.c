/* `sorted` promises are verified on every run, not only checked ones
 * (docs/language.md): flex_forward and flex_backward on the reference, the emulator
 * and the cpu backend, flex_block_mask_create, `flexc run` and `flexc
 * mask` all fail on a buffer that decreases, naming the buffer, the index
 * and the two values; flex_args.trust_sorted / `flexc run --trust-sorted` waive it.
 * The position of the decrease is fresh each run (seed printed).
 * `flexc check --explain` tells a mask the analysis decides from one that
 * needs an element-wise BlockMask, names the buffer read and the cost.
 * The emulator checks by the device path (flex_sorted_check, as CUDA
 * does): device_path_* test it against the reference's host check. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/backend.h"
#include "runtime/flex.h"
#include "runtime/npy.h"
#include "testlib.h"

enum { B = 1, H = 2, T = 200, E = 8 };

static const char *const SRC = "buffer doc: i32[T] sorted;\n"
                               "mask m(b, h, q, kv) { return doc[q] == doc[kv] && q >= kv; }\n";

static uint64_t rng;
static int32_t ids[T];
static int bad_at; /* index where ids decreases */
static char want[160];

/* Document ids in runs of 10, with one decrease at a random index. */
static void make_ids(void) {
  for (int i = 0; i < T; i++) ids[i] = i / 10;
  bad_at = 20 + (int)(tl_rand(&rng) % (T - 40));
  ids[bad_at] = ids[bad_at - 1] - 1;
  snprintf(want, sizeof want, "buffer 'doc' is declared sorted but decreases at index %d (%d after %d)",
           bad_at, ids[bad_at], ids[bad_at - 1]);
}

typedef struct Call {
  TlArr q, k, v, out, lse, dout, dq, dk, dv;
  DLTensor doc;
  flex_buffer fb;
  flex_args a;
} Call;

static void call_init(Call *c, flex_backend be, bool trust) {
  const int64_t s4[] = {B, H, T, E}, s3[] = {B, H, T};
  static int64_t dshape[1] = {T};
  DLDataType f32 = {kDLFloat, 32, 1};
  memset(c, 0, sizeof *c);
  TlArr *four[] = {&c->q, &c->k, &c->v, &c->out, &c->dout, &c->dq, &c->dk, &c->dv};
  for (int i = 0; i < 8; i++) tl_arr_init(four[i], f32, 4, s4), tl_arr_normal(four[i], &rng);
  tl_arr_init(&c->lse, f32, 3, s3);
  c->doc = (DLTensor){ids, {kDLCPU, 0}, 1, {kDLInt, 32, 1}, dshape, NULL, 0};
  c->fb = (flex_buffer){"doc", &c->doc, NULL};
  flex_args *a = &c->a;
  a->backend = be;
  a->q = &c->q.t, a->k = &c->k.t, a->v = &c->v.t, a->out = &c->out.t, a->lse = &c->lse.t;
  a->dout = &c->dout.t, a->dq = &c->dq.t, a->dk = &c->dk.t, a->dv = &c->dv.t;
  a->buffers = &c->fb, a->nbuffers = 1;
  a->trust_sorted = trust;
}

static void call_free(Call *c) {
  TlArr *all[] = {&c->q, &c->k, &c->v, &c->out, &c->lse, &c->dout, &c->dq, &c->dk, &c->dv};
  for (int i = 0; i < 9; i++) tl_arr_free(all[i]);
}

static flex_kernel *load(void) {
  flex_kernel *k = NULL;
  ck_assert_msg(flex_kernel_from_source(&k, "doc.score", SRC, strlen(SRC), NULL) == FLEX_OK, "%s",
                flex_last_error());
  return k;
}

static const flex_backend backends[] = {FLEX_BACKEND_REFERENCE, FLEX_BACKEND_EMU, FLEX_BACKEND_CPU};
static const char *const backend_names[] = {"reference", "emu", "cpu"};

/* _i: reference, emu, cpu (where this build has it). An unchecked forward
 * and backward both fail. */
START_TEST(unchecked_call_fails) {
  if (!flex_backend_available(backends[_i])) {
    fprintf(stderr, "  %s: not available here, skipped\n", backend_names[_i]);
    return;
  }
  make_ids();
  flex_kernel *k = load();
  Call c;
  call_init(&c, backends[_i], false);
  flex_status st = flex_forward(k, &c.a);
  fprintf(stderr, "  %s forward: %s\n", backend_names[_i], flex_last_error());
  ck_assert_int_eq(st, FLEX_ERR_RUNTIME);
  ck_assert_msg(strstr(flex_last_error(), want), "want '%s', got '%s'", want, flex_last_error());
  st = flex_backward(k, &c.a);
  ck_assert_int_eq(st, FLEX_ERR_RUNTIME);
  ck_assert_msg(strstr(flex_last_error(), want), "want '%s', got '%s'", want, flex_last_error());
  call_free(&c);
  flex_kernel_free(k);
}
END_TEST

/* _i: reference, emu, cpu. The waiver runs the call (its result is the caller's problem). */
START_TEST(trust_sorted_waives) {
  if (!flex_backend_available(backends[_i])) return;
  make_ids();
  flex_kernel *k = load();
  Call c;
  call_init(&c, backends[_i], true);
  ck_assert_msg(flex_forward(k, &c.a) == FLEX_OK, "%s", flex_last_error());
  call_free(&c);
  flex_kernel_free(k);
}
END_TEST

START_TEST(block_mask_create_fails) {
  make_ids();
  flex_kernel *k = load();
  Call c;
  call_init(&c, FLEX_BACKEND_REFERENCE, false);
  flex_block_mask *bm = NULL;
  flex_status st = flex_block_mask_create(&bm, k, &c.a, B, H, T, T, 16, 16, NULL);
  ck_assert_int_eq(st, FLEX_ERR_RUNTIME);
  ck_assert_msg(strstr(flex_last_error(), want), "want '%s', got '%s'", want, flex_last_error());
  ck_assert_ptr_null(bm);
  c.a.trust_sorted = true;
  ck_assert_msg(flex_block_mask_create(&bm, k, &c.a, B, H, T, T, 16, 16, NULL) == FLEX_OK, "%s",
                flex_last_error());
  flex_block_mask_free(bm);
  call_free(&c);
  flex_kernel_free(k);
}
END_TEST

/* flexc run (without --check-bounds) and flexc mask exit 1 with the
 * message; flexc run --trust-sorted exits 0. */
START_TEST(cli_fails) {
  make_ids();
  char dir[256];
  snprintf(dir, sizeof dir, "/tmp/flexc_sorted_%d", (int)getpid());
  Buf cmd = {0}, out = {0};
  buf_printf(&cmd, "rm -rf %s && mkdir -p %s", dir, dir);
  ck_assert_int_eq(system(cmd.data), 0);
  char path[512];
  snprintf(path, sizeof path, "%s/doc.score", dir);
  FILE *f = fopen(path, "w");
  fputs(SRC, f);
  fclose(f);
  Call c;
  call_init(&c, FLEX_BACKEND_REFERENCE, false);
  const char *names[] = {"q", "k", "v", "doc"};
  const DLTensor *ts[] = {&c.q.t, &c.k.t, &c.v.t, &c.doc};
  for (int i = 0; i < 4; i++) {
    snprintf(path, sizeof path, "%s/%s.npy", dir, names[i]);
    ck_assert_msg(flex_npy_save(path, ts[i]) == FLEX_OK, "%s", flex_last_error());
  }
  const char *runs[] = {"--backend reference", "--backend emu", "--backend emu --trust-sorted"};
  for (int i = 0; i < 3; i++) {
    cmd.len = 0;
    buf_printf(&cmd, "%s run %s/doc.score --q %s/q.npy --k %s/k.npy --v %s/v.npy --buffer doc=%s/doc.npy %s --out %s/out",
               tl_flexc(), dir, dir, dir, dir, dir, runs[i], dir);
    int st = tl_run(cmd.data, &out);
    fprintf(stderr, "  flexc run %s: %d %s", runs[i], st, out.data);
    ck_assert_int_eq(st, i < 2 ? 1 : 0);
    if (i < 2) ck_assert_msg(strstr(out.data, want), "want '%s', got '%s'", want, out.data);
    if (i < 2) ck_assert_msg(!strstr(out.data, "; pass"), "a hint that does not apply: %s", out.data);
    buf_free(&out);
  }
  cmd.len = 0;
  buf_printf(&cmd, "%s mask %s/doc.score --shape 1,2,%d,%d --block-size 16,16 --buffer doc=%s/doc.npy",
             tl_flexc(), dir, T, T, dir);
  int st = tl_run(cmd.data, &out);
  fprintf(stderr, "  flexc mask: %d %s", st, out.data);
  ck_assert_int_eq(st, 1);
  ck_assert_msg(strstr(out.data, want), "want '%s', got '%s'", want, out.data);
  ck_assert_msg(!strstr(out.data, "decided every block"), "%s", out.data);
  buf_free(&out);
  cmd.len = 0;
  buf_printf(&cmd, "rm -rf %s", dir);
  ck_assert_int_eq(system(cmd.data), 0);
  buf_free(&cmd);
  call_free(&c);
}
END_TEST

/* Run flexc with args on a file holding src; the exit status, output in *out. */
static int flexc_on(const char *src, const char *args, Buf *out) {
  char path[256];
  snprintf(path, sizeof path, "/tmp/flexc_explain_%d.score", (int)getpid());
  FILE *f = fopen(path, "w");
  fputs(src, f);
  fclose(f);
  Buf cmd = {0};
  buf_printf(&cmd, "%s %s %s", tl_flexc(), args, path);
  int st = tl_run(cmd.data, out);
  buf_free(&cmd);
  remove(path);
  fprintf(stderr, "  flexc %s: %d\n%s", args, st, out->data);
  return st;
}

START_TEST(check_explain) {
  Buf out = {0};
  const char *lf = "param int window = 256;\n"
                   "buffer g: bool[KV_LEN];\n"
                   "buffer pos: i32[4] sorted;\n"
                   "mask flags(b, h, q, kv) { return abs(q - kv) < window || g[q] || g[kv]; }\n"
                   "mask listed(b, h, q, kv) { return abs(q - kv) < window || pos[0] == kv || "
                   "pos[1] == kv || pos[2] == kv || pos[3] == kv; }\n"
                   "kernel by_flags { mask = flags; }\n"
                   "kernel by_list { mask = listed; }\n"
                   "kernel none { }\n";
  ck_assert_int_eq(flexc_on(lf, "check --explain --shape 1,8,8192,8192", &out), 0);
  const char *lines[] = {
      "kernel by_flags: mask flags\n  blocks: NOT decidable by interval analysis: it reads buffer 'g' (bool",
      "declared at /tmp/flexc_explain_", "up to Q_LEN*KV_LEN per call",
      "(6.71e+07 evaluations at B=1 H=8 Q_LEN=8192 KV_LEN=8192)",
      "kernel by_list: mask listed\n  blocks: decided by interval analysis",
      "kernel none: no mask"};
  for (size_t i = 0; i < sizeof lines / sizeof *lines; i++)
    ck_assert_msg(strstr(out.data, lines[i]), "want %s in:\n%s", lines[i], out.data);
  buf_free(&out);
  /* A mask that reads b and h: the cost counts them. */
  ck_assert_int_eq(flexc_on("buffer t: u8[B, H];\nmask m(b, h, q, kv) { return t[b, h] > 0 || q >= kv; }\n",
                            "check --explain --shape 2,3,100,10", &out), 0);
  ck_assert_msg(strstr(out.data, "up to B*H*Q_LEN*KV_LEN per call (6e+03 evaluations"), "%s", out.data);
  buf_free(&out);
  /* Several files: every line of the explanation names its file. */
  Buf args = {0};
  buf_printf(&args, "check --explain %s/samples/causal.score", FLEXC_SRC_DIR);
  ck_assert_int_eq(flexc_on("mask m(b, h, q, kv) { return q >= kv; }\n", args.data, &out), 0);
  buf_free(&args);
  ck_assert_msg(strstr(out.data, "/samples/causal.score: kernel default: mask causal\n") &&
                    strstr(out.data, ".score: kernel default: mask m\n"), "%s", out.data);
  for (const char *l = out.data; *l; l = strchr(l, '\n') + 1) {
    const char *named = strstr(l, ".score: ");
    ck_assert_msg(l[0] == '/' && named && named < strchr(l, '\n'), "%s", l);
  }
  buf_free(&out);
  /* `flexc run --help` says which backend it runs by default, and Python's. */
  ck_assert_int_eq(flexc_on("", "run --help", &out), 0);
  ck_assert_msg(strstr(out.data, "--backend: reference by default") &&
                    strstr(out.data, "cpu for host tensors"), "%s", out.data);
  buf_free(&out);
  /* Without --explain, --shape is a usage error; a plain check stays silent. */
  ck_assert_int_eq(flexc_on("mask m(b, h, q, kv) { return q >= kv; }\n", "check --shape 1,1,1,1", &out), 2);
  buf_free(&out);
  ck_assert_int_eq(flexc_on("mask m(b, h, q, kv) { return q >= kv; }\n", "check", &out), 0);
  ck_assert_str_eq(out.data ? out.data : "", "");
  buf_free(&out);
}
END_TEST

/* An int param out of range says so; `--param w` and `--param w=abc` are
 * both user errors (exit 1); buffer conversion errors say "out of range". */
START_TEST(cli_param_messages) {
  const char *src = "param int window = 4;\nmask m(b, h, q, kv) { return q - kv < window; }\n";
  Buf out = {0};
  ck_assert_int_eq(flexc_on(src, "mask --shape 1,1,8,8 --param window=99999999999", &out), 1);
  ck_assert_msg(strstr(out.data, "param 'window' is an int: 99999999999 is out of range"), "%s", out.data);
  buf_free(&out);
  ck_assert_int_eq(flexc_on(src, "mask --shape 1,1,8,8 --param window=2.5", &out), 1);
  ck_assert_msg(strstr(out.data, "param 'window' is an int, got 2.5"), "%s", out.data);
  buf_free(&out);
  ck_assert_int_eq(flexc_on(src, "mask --shape 1,1,8,8 --param window", &out), 1);
  buf_free(&out);
  ck_assert_int_eq(flexc_on(src, "mask --shape 1,1,8,8 --param window=abc", &out), 1);
  buf_free(&out);
  /* An i64 file whose value does not fit the i32 buffer. */
  char npy[256];
  snprintf(npy, sizeof npy, "/tmp/flexc_big_%d.npy", (int)getpid());
  int64_t big[4] = {0, (int64_t)1 << 40, 2, 3}, shape[1] = {4};
  DLTensor t = {big, {kDLCPU, 0}, 1, {kDLInt, 64, 1}, shape, NULL, 0};
  ck_assert_msg(flex_npy_save(npy, &t) == FLEX_OK, "%s", flex_last_error());
  char args[512];
  snprintf(args, sizeof args, "mask --shape 1,1,8,8 --buffer pos=%s", npy);
  ck_assert_int_eq(flexc_on("buffer pos: i32[4] sorted;\nmask m(b, h, q, kv) { return pos[0] <= kv; }\n",
                            args, &out), 1);
  ck_assert_msg(strstr(out.data, "element 1 (1099511627776) is out of range for int32"), "%s", out.data);
  buf_free(&out);
  remove(npy);
}
END_TEST

/* flexc mask on a mask over a bool buffer of keys (the analysis cannot
 * decide it): the report says so, names the read, the cost, and the
 * `sorted` encoding that would make it decidable; never "decided every
 * block". */
START_TEST(mask_report_undecidable) {
  char npy[256], args[512];
  snprintf(npy, sizeof npy, "/tmp/flexc_flags_%d.npy", (int)getpid());
  uint8_t g[256] = {0};
  g[5] = g[100] = 1;
  int64_t shape[1] = {256};
  DLTensor t = {g, {kDLCPU, 0}, 1, {kDLBool, 8, 1}, shape, NULL, 0};
  ck_assert_msg(flex_npy_save(npy, &t) == FLEX_OK, "%s", flex_last_error());
  snprintf(args, sizeof args, "mask --shape 1,1,256,256 --block-size 16,16 --buffer g=%s", npy);
  Buf out = {0};
  ck_assert_int_eq(flexc_on("param int window = 16;\nbuffer g: bool[KV_LEN];\n"
                            "mask flags(b, h, q, kv) { return abs(q - kv) < window || g[q] || g[kv]; }\n",
                            args, &out), 0);
  const char *lines[] = {
      "analysis: not decidable by interval analysis",
      "open blocks resolved element-wise (",
      "blocks: NOT decidable by interval analysis: it reads buffer 'g' (bool, 1-D, not `sorted`",
      "up to Q_LEN*KV_LEN per call", "(6.55e+04 evaluations at B=1 H=1 Q_LEN=256 KV_LEN=256)",
      "encode the data as a `sorted` buffer of positions"};
  for (size_t i = 0; i < sizeof lines / sizeof *lines; i++)
    ck_assert_msg(strstr(out.data, lines[i]), "want %s in:\n%s", lines[i], out.data);
  ck_assert_msg(!strstr(out.data, "decided every block"), "%s", out.data);
  buf_free(&out);
  remove(npy);
}
END_TEST

/* ---- the device path (flex_sorted_check) on the emulator ------------------------ */

/* One sorted buffer `s` of dtype `dt` and n elements, non-decreasing but at
 * `bad` (0: nowhere), where it drops by one: the emulator runs the entry
 * (one launch, rt_run_last_stats) and says exactly what the reference's
 * host check says. u8 values cross 127 -> 128 (an unsigned comparison),
 * i32 values are negative and positive, i64 values beyond 32 bits. */
static void device_case(const char *dt, int64_t n, int64_t bad) {
  char src[256];
  snprintf(src, sizeof src, "buffer s: %s[N] sorted;\n"
                            "mask m(b, h, q, kv) { return q >= kv || s[0] == kv; }\n", dt);
  flex_kernel *k = NULL;
  ck_assert_msg(flex_kernel_from_source(&k, "dev.score", src, strlen(src), NULL) == FLEX_OK, "%s",
                flex_last_error());
  DLDataType d = !strcmp(dt, "u8") ? (DLDataType){kDLUInt, 8, 1}
                 : !strcmp(dt, "i32") ? (DLDataType){kDLInt, 32, 1} : (DLDataType){kDLInt, 64, 1};
  TlArr x;
  tl_arr_init(&x, d, 1, &n);
  for (int64_t i = 0; i < n; i++) {
    int64_t v = d.bits == 8 ? 10 + i * 240 / n : d.bits == 32 ? i * 3 - 1000 : i * ((int64_t)1 << 33) - ((int64_t)1 << 40);
    if (bad && i == bad) v = (d.bits == 8 ? 10 + (i - 1) * 240 / n : d.bits == 32 ? (i - 1) * 3 - 1000
                       : (i - 1) * ((int64_t)1 << 33) - ((int64_t)1 << 40)) - 1;
    if (d.bits == 8) ((uint8_t *)x.t.data)[i] = (uint8_t)v;
    else if (d.bits == 32) ((int32_t *)x.t.data)[i] = (int32_t)v;
    else ((int64_t *)x.t.data)[i] = v;
  }
  Call c;
  call_init(&c, FLEX_BACKEND_REFERENCE, false);
  c.fb = (flex_buffer){"s", &x.t, NULL};
  flex_status ref = flex_forward(k, &c.a);
  char want_msg[256];
  snprintf(want_msg, sizeof want_msg, "%s", flex_last_error());
  c.a.backend = FLEX_BACKEND_EMU;
  flex_status emu = flex_forward(k, &c.a);
  fprintf(stderr, "  %s n=%lld bad=%lld: emu %d '%s'\n", dt, (long long)n, (long long)bad, emu,
          emu ? flex_last_error() : "");
  ck_assert_int_eq(rt_run_last_stats().sorted_checks, n >= 2 ? 1 : 0);
  ck_assert_int_eq(ref, bad ? FLEX_ERR_RUNTIME : FLEX_OK);
  ck_assert_int_eq(emu, ref);
  if (bad) {
    ck_assert_msg(!strcmp(flex_last_error(), want_msg), "emu '%s', reference '%s'", flex_last_error(),
                  want_msg);
    char at[64];
    snprintf(at, sizeof at, "decreases at index %lld (", (long long)bad);
    ck_assert_msg(strstr(want_msg, at), "%s", want_msg);
  }
  call_free(&c);
  tl_arr_free(&x);
  flex_kernel_free(k);
}

/* _i: u8, i32, i64. The first, a middle and the last position; lengths 1
 * and 2; and a length past one pass of the grid (1024 CTAs of 256 threads). */
START_TEST(device_path_positions) {
  static const char *const dts[] = {"u8", "i32", "i64"};
  const char *dt = dts[_i];
  device_case(dt, 1, 0);
  device_case(dt, 2, 0);
  device_case(dt, 2, 1);
  device_case(dt, 300, 0);
  device_case(dt, 300, 1);
  device_case(dt, 300, 150);
  device_case(dt, 300, 299);
  const int64_t big = 1024 * 256 + 1000;
  device_case(dt, big, 0);
  device_case(dt, big, 1024 * 256 + 1); /* found by a thread on its second pass */
  device_case(dt, big, big - 1);
}
END_TEST

/* Two sorted buffers: the first that decreases (by slot) is the one named,
 * as on the host. */
START_TEST(device_path_first_buffer) {
  const char *src = "buffer a: i32[N] sorted;\nbuffer z: i32[M] sorted;\n"
                    "mask m(b, h, q, kv) { return q >= kv || a[0] == kv || z[0] == kv; }\n";
  flex_kernel *k = NULL;
  ck_assert_msg(flex_kernel_from_source(&k, "two.score", src, strlen(src), NULL) == FLEX_OK, "%s",
                flex_last_error());
  int32_t av[5] = {0, 1, 2, 3, 4}, zv[4] = {5, 6, 7, 8};
  int64_t an[1] = {5}, zn[1] = {4};
  DLTensor at = {av, {kDLCPU, 0}, 1, {kDLInt, 32, 1}, an, NULL, 0};
  DLTensor zt = {zv, {kDLCPU, 0}, 1, {kDLInt, 32, 1}, zn, NULL, 0};
  Call c;
  call_init(&c, FLEX_BACKEND_EMU, false);
  flex_buffer fb[2] = {{"a", &at, NULL}, {"z", &zt, NULL}};
  c.a.buffers = fb, c.a.nbuffers = 2;
  ck_assert_msg(flex_forward(k, &c.a) == FLEX_OK, "%s", flex_last_error());
  ck_assert_int_eq(rt_run_last_stats().sorted_checks, 2);
  zv[3] = 6;
  ck_assert_int_eq(flex_forward(k, &c.a), FLEX_ERR_RUNTIME);
  ck_assert_str_eq(flex_last_error(), "buffer 'z' is declared sorted but decreases at index 3 (6 after 7)");
  av[2] = -1;
  ck_assert_int_eq(flex_forward(k, &c.a), FLEX_ERR_RUNTIME);
  ck_assert_str_eq(flex_last_error(), "buffer 'a' is declared sorted but decreases at index 2 (-1 after 1)");
  c.a.trust_sorted = true;
  ck_assert_msg(flex_forward(k, &c.a) == FLEX_OK, "%s", flex_last_error());
  ck_assert_int_eq(rt_run_last_stats().sorted_checks, 0);
  call_free(&c);
  flex_kernel_free(k);
}
END_TEST

int main(void) {
  rng = tl_seed();
  return TL_MAIN("sorted", 120, TL_LOOP(unchecked_call_fails, 3), TL_LOOP(trust_sorted_waives, 3),
                 TL_TEST(block_mask_create_fails), TL_TEST(cli_fails), TL_TEST(check_explain),
                 TL_TEST(cli_param_messages), TL_TEST(mask_report_undecidable),
                 TL_LOOP(device_path_positions, 3), TL_TEST(device_path_first_buffer));
}
