/* check_nomem: memory exhaustion inside the library is FLEX_ERR_NOMEM,
 * never an abort, a leak or a broken kernel.
 *
 * An allocator is installed (base_set_alloc) that fails exactly the N-th
 * request of one operation, for every N from 0 to the number of requests
 * the operation makes when nothing fails, so every allocation site the
 * operation reaches is made to fail once:
 *   compile   flex_kernel_from_source of a kernel with a score, a mask over
 *             a buffer, a sink and `grad` buffers (parse, check, lower,
 *             autodiff, intervals), then its info
 *   forward   a forward, and a backward, on each host backend (reference,
 *   backward  cpu, emu), with params, buffers, a buffer gradient and LSE
 *   helpers   a BlockMask build, tensor allocation and conversion
 * Each run must end FLEX_OK or FLEX_ERR_NOMEM with the message; after it
 * the same operation with nothing failing must give bit for bit what it
 * gave before (the kernel is still usable), and a sweep where every
 * request from the N-th on fails must end FLEX_ERR_NOMEM for N short of
 * the total. Leak checking is on (ASan builds): an interrupted call frees
 * what it had allocated.
 *
 *
 * The module tables are filled before those sweeps; the first-build sweeps
 * (cpu and emu, forward and backward) forget every module and the memory
 * store before each failing run (the disk store is off), so every request
 * of building a module is made to fail too: the CPU JIT's lowering and
 * object code, the emulator's build directory, compiler run, store and
 * load. The emulator's compiler is a stand-in that runs the real one once
 * per source and then copies its outputs, so a sweep costs copies, not
 * compiles. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/store.h"
#include "emu/emu_host.h"
#include "testlib.h"
#ifdef FLEXC_HAVE_LLVM
#include "cpu/cpu.h"
#endif

static atomic_long calls;
static long fail_at = -1;  /* the request that fails (-1: none) */
static bool fail_on;       /* ...and every later one */

static void *failing(void *ud, void *ptr, size_t size) {
  (void)ud;
  if (size == 0) {
    free(ptr);
    return NULL;
  }
  long n = atomic_fetch_add(&calls, 1);
  if (fail_at >= 0 && (n == fail_at || (fail_on && n > fail_at))) return NULL;
  return realloc(ptr, size);
}

static const char *SOURCE =
    "param float cap = 30.0;\n"
    "buffer bias: f32[H, 33] grad;\n"
    "buffer doc: i32[KV_LEN] sorted;\n"
    "buffer sinks: f32[H] grad;\n"
    "score soft(s, b, h, q, kv) { return cap * tanh(s / cap) + bias[h, clamp(q - kv + 16, 0, 32)]; }\n"
    "mask same(b, h, q, kv) { return doc[min(q, KV_LEN - 1)] == doc[kv] && kv <= q + 4; }\n"
    "sink per_head(b, h, q) { return sinks[h]; }\n"
    "kernel k { score = soft; mask = same; sink = per_head; }\n";

/* One call's tensors on the host. */
typedef struct Call {
  TlArr q, k, v, out, lse, dout, dq, dk, dv, bias, dbias, doc, sinks, dsinks;
  flex_buffer bufs[3];
  flex_param param;
  flex_args a;
} Call;

static void call_init(Call *c, flex_backend be, uint64_t *rng) {
  memset(c, 0, sizeof *c);
  const DLDataType f32 = {kDLFloat, 32, 1}, i32 = {kDLInt, 32, 1};
  const int64_t s4[4] = {1, 2, 37, 16}, s3[3] = {1, 2, 37}, sb[2] = {2, 33}, sd[1] = {37}, sh[1] = {2};
  TlArr *in[] = {&c->q, &c->k, &c->v, &c->dout};
  for (int i = 0; i < 4; i++) tl_arr_init(in[i], f32, 4, s4), tl_arr_normal(in[i], rng);
  TlArr *o4[] = {&c->out, &c->dq, &c->dk, &c->dv};
  for (int i = 0; i < 4; i++) tl_arr_init(o4[i], f32, 4, s4);
  tl_arr_init(&c->lse, f32, 3, s3);
  tl_arr_init(&c->bias, f32, 2, sb), tl_arr_uniform(&c->bias, -1, 1, rng);
  tl_arr_init(&c->dbias, f32, 2, sb);
  tl_arr_init(&c->sinks, f32, 1, sh), tl_arr_uniform(&c->sinks, -1, 1, rng);
  tl_arr_init(&c->dsinks, f32, 1, sh);
  tl_arr_init(&c->doc, i32, 1, sd);
  for (int i = 0; i < 37; i++) ((int32_t *)c->doc.t.data)[i] = i / 13;
  c->bufs[0] = (flex_buffer){"bias", &c->bias.t, &c->dbias.t};
  c->bufs[1] = (flex_buffer){"doc", &c->doc.t, NULL};
  c->bufs[2] = (flex_buffer){"sinks", &c->sinks.t, &c->dsinks.t};
  c->param = (flex_param){"cap", 20.0};
  flex_args *a = &c->a;
  a->backend = be;
  a->q = &c->q.t, a->k = &c->k.t, a->v = &c->v.t, a->out = &c->out.t, a->lse = &c->lse.t;
  a->dout = &c->dout.t, a->dq = &c->dq.t, a->dk = &c->dk.t, a->dv = &c->dv.t;
  a->buffers = c->bufs, a->nbuffers = 3, a->params = &c->param, a->nparams = 1;
}

static void call_free(Call *c) {
  TlArr *all[] = {&c->q, &c->k, &c->v, &c->out, &c->lse, &c->dout, &c->dq, &c->dk,
                  &c->dv, &c->bias, &c->dbias, &c->doc, &c->sinks, &c->dsinks};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tl_arr_free(all[i]);
}

/* The outputs an operation writes, for the bitwise comparison. */
static size_t outputs(Call *c, bool backward, TlArr **out) {
  size_t n = 0;
  if (!backward) out[n++] = &c->out, out[n++] = &c->lse;
  else out[n++] = &c->dq, out[n++] = &c->dk, out[n++] = &c->dv, out[n++] = &c->dbias, out[n++] = &c->dsinks;
  return n;
}

typedef enum Op { OP_COMPILE, OP_FORWARD, OP_BACKWARD, OP_HELPERS } Op;

typedef struct Run {
  Op op;
  flex_kernel *k;
  Call *c;
  bool first_build; /* every module forgotten before each counted or failing run */
} Run;

/* Every loaded module and the memory store forgotten: the next call builds
 * its modules again. */
static void forget_modules(void) {
#ifdef FLEXC_HAVE_LLVM
  cpu_jit_forget();
#endif
  emu_modules_forget();
  base_store_clear_memory();
}

/* The operation once; its status. */
static flex_status run_once(Run *r) {
  switch (r->op) {
  case OP_COMPILE: {
    flex_kernel *k = NULL;
    flex_status st = flex_kernel_from_source(&k, "nomem.score", SOURCE, strlen(SOURCE), NULL);
    flex_kernel_info info;
    if (!st) st = flex_kernel_get_info(k, &info);
    flex_kernel_free(k);
    return st;
  }
  case OP_FORWARD: return flex_forward(r->k, &r->c->a);
  case OP_BACKWARD: return flex_backward(r->k, &r->c->a);
  case OP_HELPERS: {
    flex_block_mask *bm = NULL;
    flex_status st = flex_block_mask_create(&bm, r->k, &r->c->a, 1, 2, 37, 37, 16, 16, NULL);
    flex_block_mask_free(bm);
    DLTensor *h = NULL;
    if (!st) st = flex_tensor_alloc(&h, FLEX_BACKEND_REFERENCE, (DLDataType){kDLFloat, 16, 1}, 4,
                                    r->c->q.t.shape, NULL);
    if (!st) st = flex_tensor_copy(h, &r->c->q.t, NULL);
    flex_tensor_free(h);
    return st;
  }
  }
  return FLEX_ERR_INVALID;
}

/* Every output poisoned, the operation run with request `at` failing
 * (and every later one when `on`); its status and the requests it made. */
static flex_status run_failing(Run *r, long at, bool on, long *made) {
  TlArr *o[8];
  size_t no = r->c ? outputs(r->c, r->op == OP_BACKWARD, o) : 0;
  for (size_t i = 0; i < no; i++) tl_arr_poison(o[i]);
  if (r->first_build && (at >= 0 || made)) forget_modules(); /* a plain rerun finds what was left */
  atomic_store(&calls, 0);
  fail_at = at, fail_on = on;
  base_set_alloc(failing, NULL);
  flex_status st = run_once(r);
  base_set_alloc(NULL, NULL);
  fail_at = -1;
  if (made) *made = atomic_load(&calls);
  return st;
}

static bool same_bits(const TlArr *x, const TlArr *y) {
  size_t n = (size_t)rt_numel(&x->t) * (x->t.dtype.bits / 8);
  return memcmp(x->t.data, y->t.data, n) == 0;
}

/* The sweep of one operation: every request made to fail once, then
 * every request from N on. Returns the number of requests. */
static long sweep(Run *r, const char *what) {
  long total = 0; /* counted on a second run: the first fills the caches */
  for (int i = 0; i < 2; i++)
    ck_assert_msg(run_failing(r, -1, false, &total) == FLEX_OK, "%s: %s", what, flex_last_error());
  TlArr *o[8], want[8];
  size_t no = r->c ? outputs(r->c, r->op == OP_BACKWARD, o) : 0;
  for (size_t i = 0; i < no; i++) {
    tl_arr_init(&want[i], o[i]->t.dtype, o[i]->t.ndim, o[i]->t.shape);
    memcpy(want[i].t.data, o[i]->t.data, (size_t)rt_numel(&o[i]->t) * (o[i]->t.dtype.bits / 8));
  }
  int nomem = 0;
  for (long n = 0; n <= total; n++) {
    flex_status st = run_failing(r, n, false, NULL);
    ck_assert_msg(st == FLEX_OK || st == FLEX_ERR_NOMEM, "%s, request %ld failing: status %d (%s)",
                  what, n, st, flex_last_error());
    if (st == FLEX_ERR_NOMEM) {
      ck_assert_msg(strstr(flex_last_error(), "out of host memory"), "%s: %s", what, flex_last_error());
      nomem++;
    }
    /* usable afterwards: the same result, bit for bit */
    ck_assert_msg(run_failing(r, -1, false, NULL) == FLEX_OK, "%s after request %ld failed: %s", what,
                  n, flex_last_error());
    for (size_t i = 0; i < no; i++)
      ck_assert_msg(same_bits(o[i], &want[i]), "%s after request %ld failed: output %zu differs", what,
                    n, i);
  }
  for (long n = 0; n < total; n += total / 16 + 1)
    ck_assert_msg(run_failing(r, n, true, NULL) == FLEX_ERR_NOMEM,
                  "%s with every request from %ld of %ld failing: %s", what, n, total,
                  flex_last_error());
  for (size_t i = 0; i < no; i++) tl_arr_free(&want[i]);
  printf("  %-28s %4ld requests, each failed once: %d runs returned FLEX_ERR_NOMEM\n", what, total, nomem);
  return total;
}

static uint64_t rng;
static const flex_backend backends[3] = {FLEX_BACKEND_REFERENCE, FLEX_BACKEND_CPU, FLEX_BACKEND_EMU};

START_TEST(compile) {
  Run r = {OP_COMPILE, NULL, NULL, false};
  ck_assert_int_gt(sweep(&r, "compile"), 3);
}
END_TEST

START_TEST(host_calls) {
  flex_backend be = backends[_i];
  if (!flex_backend_available(be)) {
    printf("  %s backend not in this build: skipped\n", flex_backend_name(be));
    return;
  }
  flex_kernel *k = NULL;
  ck_assert_int_eq(flex_kernel_from_source(&k, "nomem.score", SOURCE, strlen(SOURCE), NULL), FLEX_OK);
  Call c;
  call_init(&c, be, &rng);
  char what[64];
  for (Op op = OP_FORWARD; op <= (be == FLEX_BACKEND_REFERENCE ? OP_HELPERS : OP_BACKWARD); op++) {
    Run r = {op, k, &c, false};
    snprintf(what, sizeof what, "%s %s", flex_backend_name(be),
             op == OP_FORWARD ? "forward" : op == OP_BACKWARD ? "backward" : "helpers");
    ck_assert_int_gt(sweep(&r, what), 1);
  }
  call_free(&c);
  flex_kernel_free(k);
}
END_TEST

/* The emulator's stand-in compiler in `dir`: a shell script that runs the
 * real one (`real`) the first time it sees a source (or object) and keeps
 * the output, and copies it afterwards. A source is known by its text and
 * the headers beside it (the emulator writes the kernel headers it
 * includes there), so a kept object never outlives a change to them.
 * Returns its command line. */
static void stand_in_cxx(const char *dir, const char *real, char *cmd, size_t cap) {
  char path[1100];
  snprintf(path, sizeof path, "%s/cxx.sh", dir);
  FILE *f = fopen(path, "w");
  ck_assert_msg(f, "cannot write %s", path);
  fprintf(f,
          "#!/bin/sh\n"
          "# check_nomem's stand-in C++ compiler: the real one once per input, then copies.\n"
          "for a; do [ \"$a\" = --version ] && { echo 'check_nomem stand-in for %s'; exit 0; }; done\n"
          "out=; in=; prev=\n"
          "for a; do\n"
          "  if [ \"$prev\" = -o ]; then out=$a; else case $a in *.cu|*.o) in=$a;; esac; fi\n"
          "  prev=$a\n"
          "done\n"
          "d=$(dirname \"$in\")\n"
          "kept=%s/$(cat \"$in\" \"$d\"/*.h \"$d\"/*.cuh 2>/dev/null | cksum | cut -d' ' -f1).${out##*.}\n"
          "[ -f \"$kept\" ] && exec cp \"$kept\" \"$out\"\n"
          "%s \"$@\" && cp \"$out\" \"$kept.$$\" && mv \"$kept.$$\" \"$kept\"\n",
          real, dir, real);
  ck_assert_int_eq(fclose(f), 0);
  snprintf(cmd, cap, "sh %s", path);
}

/* The first-build sweeps: a forward and a backward whose modules are built
 * in every run (cpu, emu), or loaded from the disk store in every run (emu:
 * a CPU object cannot be added to one process's JIT twice). */
START_TEST(first_build) {
  flex_backend be = _i ? FLEX_BACKEND_EMU : FLEX_BACKEND_CPU;
  bool from_disk = _i == 2;
  if (!flex_backend_available(be)) {
    printf("  %s backend not in this build: skipped\n", flex_backend_name(be));
    return;
  }
  /* The stand-in's outputs live beside the suite's store, so only the first
   * run of the suite in a build tree compiles. */
  const char *store = getenv("FLEXC_CACHE_DIR");
  char dir[900], cmd[1200], disk[1000];
  if (store && *store && strcmp(store, "off")) {
    snprintf(dir, sizeof dir, "%s/check_nomem-cxx", store);
    mkdir(store, 0755), mkdir(dir, 0755); /* either may exist */
    ck_assert_msg(access(dir, W_OK) == 0, "cannot make %s", dir);
  } else {
    snprintf(dir, sizeof dir, "%s/flexc-nomem-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    ck_assert_msg(mkdtemp(dir), "cannot make %s", dir);
  }
  const char *real = getenv("FLEXC_EMU_CXX");
  stand_in_cxx(dir, real && *real ? real : "c++", cmd, sizeof cmd);
  setenv("FLEXC_EMU_CXX", cmd, 1);
  snprintf(disk, sizeof disk, "%s/store", dir);
  setenv("FLEXC_CACHE_DIR", from_disk ? disk : "off", 1);
  flex_kernel *k = NULL;
  ck_assert_int_eq(flex_kernel_from_source(&k, "nomem.score", SOURCE, strlen(SOURCE), NULL), FLEX_OK);
  Call c;
  call_init(&c, be, &rng);
  char what[64];
  for (Op op = OP_FORWARD; op <= OP_BACKWARD; op++) {
    /* the requests of a call whose modules are loaded: a first build makes more */
    Run warm = {op, k, &c, false};
    long loaded = 0;
    for (int i = 0; i < 2; i++)
      ck_assert_msg(run_failing(&warm, -1, false, &loaded) == FLEX_OK, "%s", flex_last_error());
    Run r = {op, k, &c, true};
    snprintf(what, sizeof what, "%s %s, %s", flex_backend_name(be),
             op == OP_FORWARD ? "forward" : "backward", from_disk ? "first load" : "first build");
    long total = sweep(&r, what);
    ck_assert_msg(total > loaded, "%s: %ld requests, no more than the %ld of a call with its modules loaded",
                  what, total, loaded);
  }
  call_free(&c);
  flex_kernel_free(k);
}
END_TEST

int main(void) {
  rng = tl_seed();
  return TL_MAIN("nomem", 600, TL_TEST(compile), TL_LOOP(host_calls, 3), TL_LOOP(first_build, 3));
}
