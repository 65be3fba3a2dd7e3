/* The call fuzzer: random calls through flex.h that combine every optional
 * part of flex_args (DSL.md, flex.h) on one backend, each against the float64
 * reference's plain call of the same problem (compact float64 tensors).
 *
 * A call draws a kernel from the pool below (no mask, implicit masks, a
 * mask the runtime builds lists for, a float mask, `grad` buffers, `sorted`
 * buffers of i32, i64 and u8, buffers of every dtype, params left at their
 * defaults or set, scores of -inf and fully masked rows) and then: B, H,
 * GQA ratio, Q_LEN and KV_LEN (odd, sometimes 0), E and EV (unequal too),
 * fp32 / fp16 / bf16 inputs and any allowed output dtype, padded, packed
 * (cu_seqlens) or paged layouts, strided views in any dim order with gaps
 * and misaligned starts (testlib_view.c), dLSE, a scale, a caller's
 * BlockMask (64 or 128 blocks, broadcast over B and H or not), dropout,
 * deterministic, kv_splits, checked runs, trust_sorted, grad tensors
 * present or NULL (float32 or float64), the forward alone or forward and
 * backward; on the emulator sm_80 or sm_90a. One call in ten instead
 * breaks one rule of the API and must get FLEX_ERR_INVALID (or, for a
 * broken `sorted` promise, FLEX_ERR_RUNTIME) with a message naming it.
 * Kernels with a sink (per head, per query, -inf on some heads) are in the
 * pool; a padded call may be a shard of a longer sequence (q_offset,
 * kv_offset and the whole lengths, buffers sized by those); q, k and v
 * may be float64, which only the reference runs. A call the API documents
 * as unsupported (float64 off the reference) must get
 * FLEX_ERR_UNSUPPORTED with the message that says so.
 *
 * Every other call must succeed (FLEX_ERR_UNSUPPORTED with a message is
 * counted and listed, never silent) and match the reference: every output
 * by relative norm error within the project's tolerances (NaN never
 * passes), fully masked rows exactly; no byte around or between a tensor's
 * elements written, no input changed; a deterministic backward the same
 * bits twice. On the CUDA backend over the stand-in driver (--backend
 * cuda: tests/cuda/mockcuda.c, which runs no kernel) the host path is
 * checked: no crash, documented errors only, every launch's geometry and
 * shared memory legal and every operation on the caller's stream.
 *
 * FLEXC_CALL_FUZZ_SECONDS and FLEXC_CALL_FUZZ_CALLS bound a run (either
 * or both; 25 seconds when neither is set); call i is drawn from
 * FLEXC_SEED (printed) and i, so FLEXC_CALL_FUZZ_ONLY=i replays one; a failing call is printed as a Spec
 * initializer for the regression table. scripts/fuzz.sh call-BACKEND
 * MINUTES runs it for longer.
 *
 * FLEXC_CALL_FUZZ_MODULES=N pools kernel modules: the choices that make a
 * module (spec_draw's mrng) of call i come from the seed and i mod N, the
 * rest from the seed and i. On the emulator a new module is a host
 * compile of about two seconds and a call on a compiled one about a
 * thirtieth of that, so a long run there combines every optional part of
 * a call over N modules per seed instead of compiling for nearly every
 * call. */
#include <check.h>
#include <dlfcn.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "call_fuzz.h"
#include "cuda/nvrtc.h"

/* ---- the backend under test and the run's bounds ---- */

static flex_backend backend = FLEX_BACKEND_REFERENCE;
static bool mock;        /* cuda over the stand-in driver: host path only */
static uint64_t seed0;   /* the run's seed */
static double seconds;   /* time bound (0: none) */
static long max_calls;   /* call bound (0: none) */
static long pool;        /* module pool size (0: none) */
static long only = -1;   /* replay one call */
static void *mock_lib;   /* the stand-in driver (dlopen handle) */
static char mock_stream_tag; /* its address is the caller's stream */

/* What a run saw. */
typedef struct Tally {
  long calls, ok, backward, unsupported, injected, refused, compared;
  long given_o; /* backwards matched against the reference given their own O (and LSE) */
  CallCounts n; /* masked rows exact, outputs zero but for rounding */
  char unsupported_msgs[8][160];
  int nmsgs;
} Tally;
static Tally tally;

/* ---- failures ---- */

static char current[2048]; /* the call in flight, printed when it crashes or hangs */

static void on_signal(int sig) {
  static const char head[] = "\ncall fuzzer: signal while running this call:\n";
  ssize_t w = write(2, head, sizeof head - 1);
  w = write(2, current, strlen(current));
  (void)w;
  signal(sig, SIG_DFL);
  raise(sig);
}

/* ---- one call ---- */

static bool run_spec(const Spec *s, uint64_t data_seed, char *why, size_t cap);

/* Describe, run and judge call s; a failure fails the test with the spec. */
static void one(const Spec *s, uint64_t data_seed, const char *label) {
  spec_print(s, current, sizeof current);
  size_t n = strlen(current);
  snprintf(current + n, sizeof current - n, "/* %s, data seed %llu */\n", label,
           (unsigned long long)data_seed);
  char why[1024] = "";
  alarm(backend == FLEX_BACKEND_EMU || mock ? 900 : 120); /* an emulator build is minutes under load */
  bool ok = run_spec(s, data_seed, why, sizeof why);
  alarm(0);
  if (!ok) fprintf(stderr, "call fuzzer (%s) failed: %s\n%s", flex_backend_name(backend), why, current);
  ck_assert_msg(ok, "%s: %s", label, why);
}

/* Expected status and the text its message must contain, for an injected error. */
static bool expect(flex_status st, flex_status want, const char *word, const char *what, char *why,
                   size_t cap) {
  const char *msg = flex_last_error();
  if (st == want && msg[0] && strstr(msg, word)) return true;
  snprintf(why, cap, "%s: status %d (want %d), message '%s' (want one naming '%s')", what, st, want, msg,
           word);
  return false;
}

/* A status other than OK from a valid call: FLEX_ERR_UNSUPPORTED with a
 * message is allowed and counted; anything else fails. */
static bool allowed(flex_status st, const char *what, char *why, size_t cap) {
  const char *msg = flex_last_error();
  if (st == FLEX_ERR_UNSUPPORTED && msg[0]) {
    tally.unsupported++;
    const char *seq = strstr(msg, "): "); /* "sequence b (rows ...): " of a packed call */
    if (!strncmp(msg, "sequence ", 9) && seq) msg = seq + 3;
    bool seen = false;
    for (int i = 0; i < tally.nmsgs; i++) seen |= !strncmp(tally.unsupported_msgs[i], msg, 60);
    if (!seen && tally.nmsgs < 8) snprintf(tally.unsupported_msgs[tally.nmsgs++], 160, "%s", msg);
    return true;
  }
  snprintf(why, cap, "%s: status %d: %s", what, st, msg[0] ? msg : "(no message)");
  return false;
}

/* The stand-in driver's record: no rule broken, everything on our stream. */
static bool mock_clean(char *why, size_t cap) {
  const char *err = dlsym(mock_lib, "mock_error");
  int foreign = *(int *)dlsym(mock_lib, "mock_foreign");
  if (!err[0] && !foreign) return true;
  snprintf(why, cap, "the driver saw %s%s%d operations on another stream", err, err[0] ? "; " : "",
           foreign);
  return false;
}

static bool run_spec(const Spec *s, uint64_t data_seed, char *why, size_t cap) {
  Call c;
  uint64_t rng = data_seed;
  if (!call_init(&c, s, backend, mock, &rng, why, cap)) return false;
  if (mock) *(void **)dlsym(mock_lib, "mock_stream") = &mock_stream_tag, c.ta.stream = &mock_stream_tag;
  bool ok = true;
  tally.calls++;
  if (s->inject) { /* the broken rule must be named (the backward's: after a good forward) */
    tally.injected++;
    flex_status want;
    const char *word;
    bool bwd = call_inject(&c, s->inject, &want, &word);
    if (bwd) call_inject_undo(&c);
    flex_status st = flex_forward(c.kern, &c.ta);
    if (bwd && st == FLEX_OK) call_inject(&c, s->inject, &want, &word), st = flex_backward(c.kern, &c.ta);
    if (st == FLEX_ERR_UNSUPPORTED) ok = allowed(st, inject_name(s->inject), why, cap);
    else if (bwd && st != FLEX_OK && st != want) ok = allowed(st, "the forward before the break", why, cap);
    else ok = expect(st, want, word, inject_name(s->inject), why, cap);
    if (ok) ok = call_guards(&c, why, cap);
    call_free(&c);
    return ok;
  }
  const char *word;
  if (spec_refused(s, backend, &word)) { /* float64 off the reference */
    tally.refused++;
    flex_status st = flex_forward(c.kern, &c.ta);
    ok = expect(st, FLEX_ERR_UNSUPPORTED, word, "forward", why, cap);
    if (ok && s->backward)
      ok = expect(flex_backward(c.kern, &c.ta), FLEX_ERR_UNSUPPORTED, word, "backward", why, cap);
    ok = ok && call_guards(&c, why, cap);
    call_free(&c);
    return ok;
  }
  /* the reference's plain call first: the oracle */
  if (!mock && flex_forward(c.kern, &c.ra) != FLEX_OK) {
    snprintf(why, cap, "the reference's plain forward failed: %s", flex_last_error());
    call_free(&c);
    return false;
  }
  flex_status st = flex_forward(c.kern, &c.ta);
  if (st != FLEX_OK) {
    ok = allowed(st, "forward", why, cap) && call_guards(&c, why, cap);
    call_free(&c);
    return ok;
  }
  tally.ok++;
  if (mock) ok = mock_clean(why, cap) && call_guards(&c, why, cap);
  else ok = call_compare(&c, false, &tally.n, why, cap);
  if (ok && s->backward) {
    if (!mock && flex_backward(c.kern, &c.ra) != FLEX_OK) {
      snprintf(why, cap, "the reference's plain backward failed: %s", flex_last_error());
      call_free(&c);
      return false;
    }
    st = flex_backward(c.kern, &c.ta);
    if (st != FLEX_OK) {
      ok = allowed(st, "backward", why, cap) && call_guards(&c, why, cap);
    } else {
      tally.backward++;
      if (mock) ok = mock_clean(why, cap) && call_guards(&c, why, cap);
      else ok = call_compare(&c, true, &tally.n, why, cap);
      /* The backward reads O as given (D = rowsum(dO O), docs/language.md)
       * and a shard's LSE too: where a gradient is nearly 0 by cancellation
       * (a scalar buffer's sum over every element, one dominant key), the
       * rounding of the tested call's own 16-bit O decides its digits, so
       * it is also judged against the reference given that same O (and
       * LSE), allowing the gradient's measured sensitivity to that
       * rounding; either oracle may pass it. The reference judged against
       * itself too: one query whose keys' weights sit on one key has a dQ
       * that O's rounding moves by a sixth (FLEXC_SEED=4766800563021089184,
       * call 1584). */
      if (!ok && !mock) {
        call_give_outputs(&c);
        char why2[512];
        if (flex_backward(c.kern, &c.ra) == FLEX_OK && call_compare(&c, true, &tally.n, why2, sizeof why2))
          ok = true, tally.given_o++;
      }
      if (ok && s->deterministic && !mock) ok = call_deterministic(&c, why, cap);
    }
  }
  tally.compared += ok && !mock;
  call_free(&c);
  return ok;
}

/* ---- regressions: calls that once failed, by name ---- */

static const struct {
  const char *name; /* what went wrong */
  Spec s;
} regressions[] = {
    /* a `grad` buffer passed without a gradient tensor (5c9d370) */
    {"grad buffer without a gradient tensor",
     {.kern = K_RELPOS,
      .dt = 1,
      .B = 1,
      .H = 2,
      .HKV = 1,
      .QL = 33,
      .KL = 47,
      .E = 16,
      .EV = 16,
      .backward = 1}},
    /* a paged call without queries returned FLEX_OK before validating anything but its tensors'
     * shapes: here an unknown arch (FLEXC_SEED=4766742717556991069, call 643 on cpu) */
    {"paged call of no queries with an unknown arch",
     {.kern = K_PARAMS,
      .B = 3,
      .H = 9,
      .HKV = 3,
      .QL = 0,
      .KL = 22,
      .E = 30,
      .EV = 35,
      .layout = L_PAGED,
      .lens_kv = {12, 10, 21},
      .page_size = 44,
      .spare_pages = 1,
      .out_dt = 1,
      .odd = 0x19551,
      .deterministic = 1,
      .check_bounds = 1,
      .set_params = 1,
      .scale = 0.70694161431731672,
      .inject = I_ARCH}},
    {"paged call of no queries, valid", /* ... and a valid one still runs */
     {.kern = K_PARAMS,
      .B = 2,
      .H = 2,
      .HKV = 1,
      .QL = 0,
      .KL = 22,
      .E = 16,
      .EV = 8,
      .layout = L_PAGED,
      .lens_kv = {12, 21},
      .page_size = 16}},
    /* the reference's backward of a shard reads the given (merged) O and LSE: a float32 LSE
     * rounds its gradients at 1e-7, which the fuzzer once judged at float64's 1e-10
     * (FLEXC_SEED=4766764860860119492, call 20) */
    {"shard backward on the reference with a float32 LSE",
     {.kern = K_PARAMS,
      .dt = 2,
      .B = 1,
      .H = 1,
      .HKV = 1,
      .QL = 28,
      .KL = 59,
      .E = 15,
      .EV = 34,
      .out_dt = 2,
      .odd = 0x13c40,
      .dlse = 1,
      .backward = 1,
      .set_params = 1,
      .grads = 0xba0b8a7b,
      .grad64 = 1,
      .kv_off = 35,
      .kv_total = 97}},
    /* a row with no keys and a sink of -inf (here: a shard past kv_offset 0, which leaves the
     * sink out) has LSE -inf; the sink's weight exp(sk - LSE) was exp(NaN), its gradient NaN
     * (FLEXC_SEED=4766772752497634411, call 98, reference) */
    {"sink gradient of a row with no keys and no sink",
     {.kern = K_SINK_QUERY,
      .dt = 1,
      .B = 3,
      .H = 3,
      .HKV = 1,
      .QL = 24,
      .KL = 0,
      .E = 3,
      .EV = 3,
      .odd = 0x238a6,
      .dlse = 1,
      .backward = 1,
      .deterministic = 1,
      .set_params = 1,
      .grads = 0x74f447d1,
      .dropout = 0.3f,
      .q_off = 6,
      .kv_off = 46,
      .q_total = 34,
      .kv_total = 57}},
};
#define NREGRESSIONS ((int)(sizeof regressions / sizeof *regressions))

START_TEST(regression) {
  uint64_t data = seed0 ^ (0x9e3779b97f4a7c15ull * (uint64_t)(_i + 1));
  Spec s = regressions[_i].s;
  if (mock) s.out_dt = 0; /* the cuda backend writes q's dtype only (spec_draw) */
  one(&s, data, regressions[_i].name);
}
END_TEST

/* ---- random calls ---- */

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* What the run did so far. */
static void report(double t) {
  fprintf(stderr,
          "call fuzzer, %s%s: %ld calls in %.1f s (%.1f/s): %ld forward ok, %ld backward ok, %ld matched "
          "the reference, %ld injected errors caught, %ld refused as documented, %ld unsupported, %ld fully "
          "masked rows exact, %ld outputs 0 but for rounding (not compared by a ratio), %ld "
          "backwards matched given their own O%s\n",
          flex_backend_name(backend), mock ? " over the stand-in driver" : "", tally.calls, t,
          (double)tally.calls / (t > 0 ? t : 1), tally.ok, tally.backward, tally.compared,
          tally.injected, tally.refused, tally.unsupported, tally.n.masked_rows, tally.n.unmeasured,
          tally.given_o, pool ? ", modules pooled" : "");
}

START_TEST(random_calls) {
  double t0 = now(), shown = t0;
  long i = only >= 0 ? only : 0;
  for (;; i++) {
    if (now() - shown >= 300) report((shown = now()) - t0); /* progress of a long run */
    uint64_t rng = seed0 + 0x9e3779b97f4a7c15ull * (uint64_t)i;
    uint64_t mrng = pool ? (seed0 ^ 0x5851f42d4c957f2dull) + 0x9e3779b97f4a7c15ull * (uint64_t)(i % pool) : 0;
    Spec s;
    spec_draw(&s, backend, mock, &rng, pool ? &mrng : &rng);
    char label[128], pooled[48] = "";
    if (pool) snprintf(pooled, sizeof pooled, " FLEXC_CALL_FUZZ_MODULES=%ld", pool);
    snprintf(label, sizeof label, "call %ld of FLEXC_SEED=%llu%s", i, (unsigned long long)seed0, pooled);
    one(&s, tl_rand(&rng), label);
    if (only >= 0) break;
    if ((max_calls && i + 1 >= max_calls) || (seconds > 0 && now() - t0 >= seconds)) break;
  }
  report(now() - t0);
  for (int m = 0; m < tally.nmsgs; m++) fprintf(stderr, "  unsupported: %s\n", tally.unsupported_msgs[m]);
}
END_TEST

int main(int argc, char **argv) {
  for (int i = 1; i + 1 < argc; i++)
    if (!strcmp(argv[i], "--backend") && !flex_backend_parse(argv[i + 1], &backend)) {
      fprintf(stderr, "unknown backend %s\n", argv[i + 1]);
      return 2;
    }
  seed0 = tl_seed();
  /* either bound or both; 25 seconds when neither is given */
  const char *env = getenv("FLEXC_CALL_FUZZ_CALLS");
  max_calls = env && *env ? atol(env) : 0;
  env = getenv("FLEXC_CALL_FUZZ_SECONDS");
  seconds = env && *env ? atof(env) : max_calls > 0 ? 0.0 : 25.0;
  env = getenv("FLEXC_CALL_FUZZ_MODULES");
  pool = env && *env ? atol(env) : 0;
  if (pool < 0) pool = 0;
  env = getenv("FLEXC_CALL_FUZZ_ONLY");
  only = env && *env ? atol(env) : -1;
  if (backend == FLEX_BACKEND_CUDA) {
    const char *path = tl_mock_driver();
    if (!path || rt_nvrtc_version() < 0) {
      printf("skipped: the cuda backend over the stand-in driver needs it built and NVRTC: %s\n",
             path ? flex_last_error() : "no stand-in driver");
      return 77;
    }
    setenv("FLEXC_LIBCUDA", path, 1);
    mock = true;
    if (!flex_backend_available(FLEX_BACKEND_CUDA) || !(mock_lib = dlopen(path, RTLD_NOW | RTLD_NOLOAD))) {
      printf("skipped: the cuda backend over the stand-in driver: %s\n", flex_last_error());
      return 77;
    }
  } else if (!flex_backend_available(backend)) {
    printf("skipped: %s\n", flex_last_error());
    return 77;
  }
  int sigs[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGALRM};
  for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++) signal(sigs[i], on_signal);
  tl_one_process();
  int budget = seconds > 0 ? (int)(seconds + 900) : 7 * 86400; /* a call-bounded run: a week */
  return TL_MAIN("call_fuzz", budget, TL_LOOP(regression, only >= 0 ? 0 : NREGRESSIONS),
                 TL_TEST(random_calls));
}
