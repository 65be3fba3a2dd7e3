/* testlib.h: helpers shared by the Check suites. */
#ifndef FLEXC_TESTLIB_H
#define FLEXC_TESTLIB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <check.h>

#include "base/base.h"
#include "runtime/flex.h"
#include "runtime/npy.h"

/* Path of a file in the source tree ("tests/frontend/cases/x.score" -> absolute;
 * in a FLEXC_PORTABLE build, relative to the working directory). */
const char *tl_src_path(const char *rel);
/* A kernel from the source-tree file `path` ("samples/x.score") or, with
 * path NULL, from the text `src` named `name`; a failure aborts the test
 * with the compiler's message. */
flex_kernel *tl_load(const char *path, const char *name, const char *src);
/* The flexc binary under test (from $FLEXC_BIN). */
const char *tl_flexc(void);
/* Run a shell command; capture stdout+stderr into *out (heap, caller frees
 * with buf_free). Returns the exit status, or 128+signal if it was killed. */
int tl_run(const char *cmd, Buf *out);
/* A fresh seed for this run (time and pid, or $FLEXC_SEED), printed once. */
uint64_t tl_seed(void);
/* splitmix64-based generator. */
uint64_t tl_rand(uint64_t *state);
double tl_uniform(uint64_t *state); /* [0, 1) */
double tl_normal(uint64_t *state);

/* ---- host arrays for the numerical suites (testlib_arr.c) ---- */

/* A host array and its DLTensor view, ready for flex_args. */
typedef struct TlArr {
  RtArray a;  /* the elements (zeroed by tl_arr_init) */
  DLTensor t; /* view of `a`; valid until tl_arr_free */
} TlArr;

/* Allocate a zeroed array of dtype dt and shape[0..nd) with its view. */
void tl_arr_init(TlArr *x, DLDataType dt, int nd, const int64_t *shape);
/* Release the elements (a zeroed or never-filled TlArr is fine too). */
void tl_arr_free(TlArr *x);
/* Every element NaN, so an output the code under test never writes fails. */
void tl_arr_poison(TlArr *x);
/* Every element standard normal from *rng (rounded to x's dtype). */
void tl_arr_normal(TlArr *x, uint64_t *rng);
/* Every element uniform in [lo, hi) from *rng (rounded to x's dtype). */
void tl_arr_uniform(TlArr *x, double lo, double hi, uint64_t *rng);

/* A tested dtype with the project's forward and gradient tolerances. */
typedef struct TlDtype {
  const char *name;   /* "fp32", "fp16", "bf16" */
  uint8_t code, bits; /* DLPack type code and width */
  double tol, gtol;   /* relative-error limits: forward (out, lse), gradients */
} TlDtype;
/* fp32, fp16, bf16, in that order. */
extern const TlDtype tl_dtypes[3];

/* Relative norm error |x - ref| / |ref| over every element. Different
 * shapes give infinity; NaN on either side gives infinity, and so does an
 * infinity that the other side does not match; equal infinities on both sides (LSE
 * of fully masked rows) count as exact; an all-zero reference gives
 * infinity, since it proves nothing. */
double tl_rel_err(const RtArray *x, const RtArray *ref);
/* How far a moved from b, relative to b: |a - b| / |b| over the elements
 * finite in both (0 where b is all zero). */
double tl_rel_moved(const RtArray *a, const RtArray *b);
/* dst = a new array with src's dtype, shape and values. */
void tl_array_copy(RtArray *dst, const RtArray *src);
/* A gradient judged against the reference given the tested call's O may
 * differ from it by its dtype's tolerance plus this many times its measured
 * sensitivity to that O's rounding (tl_call_compare, the call fuzzer; the
 * rule is in docs/testing.md). The tested call rounds O, P for P V and
 * dS, each moving an ill-conditioned gradient about as much as O's
 * rounding alone, and not always with the same sign: a relative-position
 * slope's gradient that O's bf16 rounding moved by 13% was 4.5 times that
 * off on the cpu backend (FLEXC_SEED=4766815900350915238, call 25496). */
#define TL_SENSITIVITY_ROUNDINGS 8.0

/* A tensor in the tested dtype (`x`, for the backend under test) and its
 * float64 twin (`ref`, for the reference backend). */
typedef struct TlPair {
  RtArray x, ref;    /* tested-dtype tensor; float64 twin */
  DLTensor tx, tref; /* views of x and ref */
} TlPair;

/* fill: random normal values from *rng, rounded to dt and copied into ref;
 * otherwise x is poisoned with NaN (ref stays zero for the reference to
 * write). */
void tl_pair_init(TlPair *p, DLDataType dt, int nd, const int64_t *shape, bool fill,
                  uint64_t *rng);
/* Release both tensors. */
void tl_pair_free(TlPair *p);
/* Relative norm error of x against ref, stricter than tl_rel_err: any
 * NaN or infinity on either side gives infinity; an all-zero reference
 * gives infinity. */
double tl_pair_err(const TlPair *p);

/* ---- tensors with odd layouts in guarded memory (testlib_view.c) ---- */

enum { TL_VIEW_MAXDIMS = 4 };

/* A tensor inside an allocation whose other bytes are 0xff. */
typedef struct TlView {
  DLTensor t;                              /* the view */
  int64_t shape[TL_VIEW_MAXDIMS];          /* its shape */
  int64_t strides[TL_VIEW_MAXDIMS];        /* its strides (elements) */
  unsigned char *mem;                      /* the allocation */
  size_t bytes;                            /* its size */
  unsigned char *elem;                     /* per byte of mem: 1 inside an element */
} TlView;

/* A view of dtype dt and shape[0..nd) (nd <= 4): compact when !odd, else
 * from *rng the dims (but the last) in any memory order, gaps after any
 * dim, and the data pointer and byte_offset off by 0..2 elements each. */
void tl_view_init(TlView *v, DLDataType dt, int nd, const int64_t *shape, bool odd, uint64_t *rng);
void tl_view_free(TlView *v);
int64_t tl_view_count(const TlView *v);
/* Copy src's elements (row-major, same count) in / the elements out into
 * a fresh float64 array dst (converting). */
void tl_view_put(TlView *v, const RtArray *src);
void tl_view_get(const TlView *v, RtArray *dst);
/* Every element NaN (0xff bytes; -1 for ints). */
void tl_view_poison(TlView *v);
/* Bytes outside the elements that are no longer 0xff (the first printed,
 * naming `name`): a write outside the tensor. */
int64_t tl_view_guards(const TlView *v, const char *name);
/* A hash of every byte of the allocation (an input must keep it). */
uint64_t tl_view_hash(const TlView *v);

/* ---- one attention call against the float64 reference (testlib_call.c) ---- */

/* Problem sizes (H % HKV == 0). */
typedef struct TlShape {
  int B, H, HKV, QL, KL, E, EV;
} TlShape;

/* What one call runs. Zero-initialise, then set what it needs. */
typedef struct TlCase {
  const char *sample;          /* "causal": samples/causal.score; NULL: src */
  const char *name, *src;      /* source text and its name (sample NULL) */
  TlShape s;                   /* sizes (packed: B sequences, QL and KL unused) */
  const TlDtype *dt;           /* q, k, v, dO dtype and tolerances (NULL: fp32) */
  flex_backend backend;        /* the backend under test */
  const char *arch;            /* its flex_args.arch (emu: NULL, "sm_80", "sm_90a") */
  const int *lens_q, *lens_kv; /* a packed batch: B query and key lengths (NULL: padded) */
  int page_size;               /* a paged K/V cache of pages this long (0: none), forward only */
  int max_pages;               /* its page table's columns (0: KL / page_size rounded up) */
  const int *kv_lens;          /* its B key lengths (<= KL) */
  bool dlse;                   /* the backward gets a dLSE */
  bool native_out;             /* the tested O in q's dtype (else float32) */
  bool native_grads;           /* the tested dQ, dK, dV in q's dtype (else float32) */
  bool deterministic;          /* flex_args.deterministic of the tested call */
  double scale;                /* flex_args.scale of both calls (0: 1/sqrt(E)) */
} TlCase;

enum { TL_MAXBUF = 4, TL_MAXPARAM = 8 };
/* The compared outputs, as indices of TlCall.err. */
enum { TL_OUT, TL_LSE, TL_DQ, TL_DK, TL_DV, TL_DBUF, TL_NERR };
/* What tl_call_check compares: O and LSE, the gradients. */
enum { TL_FWD = 1, TL_BWD = 2 };

/* One call's tensors for the backend under test ([0]) and the float64
 * reference ([1]): the inputs are shared (the reference decodes fp16 and
 * bf16 exactly, so the error measured is the backend's own), outputs are
 * NaN-poisoned, params and buffers shared, buffer gradients twinned. */
typedef struct TlCall {
  TlCase c;                       /* the case (a copy) */
  flex_kernel *kern;              /* its kernel */
  uint64_t *rng;                  /* the generator inputs come from */
  int TQ, TK;                     /* rows of a packed batch (padded: QL, KL) */
  TlArr q, k, v, dout, dlse;      /* inputs (dLSE float32) */
  TlArr out[2], lse[2], dq[2], dk[2], dv[2]; /* outputs: tested, reference */
  TlArr cuq, cuk;                 /* a packed batch's offsets */
  TlArr pt, kvl;                  /* a paged cache's table (pages in reverse order) and lengths */
  flex_param params[TL_MAXPARAM]; /* params of both calls */
  int np;
  TlArr buf[TL_MAXBUF], gbuf[2][TL_MAXBUF]; /* buffers; gradients (float32, float64) */
  bool grad[TL_MAXBUF];           /* buffer i has gradients */
  flex_buffer fb[2][TL_MAXBUF];   /* as each call gets them */
  int nb;
  flex_block_mask *bm;            /* a caller's BlockMask of both calls (tl_call_block_mask) */
  flex_args a[2];                 /* the tested call, the reference call */
  double err[TL_NERR];            /* tl_call_check's errors (0 where not compared) */
  double slack[TL_NERR];          /* what a gradient's measured sensitivity adds to its tolerance */
  int masked;                     /* fully masked rows of the reference */
} TlCall;

/* Load the case's kernel (a failure aborts the test), allocate its tensors
 * with fresh inputs from *rng, poison the outputs and wire both calls. */
void tl_call_init(TlCall *c, const TlCase *tc, uint64_t *rng);
/* The params and buffers every sample of samples/ runs with (a sample not
 * listed needs none): moderate values, fully masked rows in some. */
void tl_call_sample_extras(TlCall *c);
/* A param of both calls. */
void tl_call_param(TlCall *c, const char *name, double value);
/* A buffer of both calls (zeroed; the caller fills it), with gradients
 * (poisoned) when grad. */
TlArr *tl_call_buffer(TlCall *c, const char *name, DLDataType dt, int nd, const int64_t *shape,
                      bool grad);
/* Both calls get a caller's BlockMask of blocks bq x bk, built by
 * flex_block_mask_create from mask_kernel's mask (NULL: the call's own)
 * with the call's params and buffers; freed with the call. */
void tl_call_block_mask(TlCall *c, flex_kernel *mask_kernel, int bq, int bk);
/* Forward (backward) of side i (0 tested, 1 reference): the status. */
flex_status tl_call_run(TlCall *c, int i, bool backward);
/* Forward (backward) on the reference, then on the backend under test; a
 * failure aborts the test with the message. */
void tl_call_forward(TlCall *c);
void tl_call_backward(TlCall *c);
/* Both sides' O and LSE become the reference forward's, rounded to what
 * the tested call reads, so that a backward measures the backward alone. */
void tl_call_ref_outputs(TlCall *c);
/* Every output of side i (0 tested, 1 reference) NaN again. */
void tl_call_poison(TlCall *c, int side);
/* Compare `what` (TL_FWD, TL_BWD) by relative norm error against the
 * tolerances of c->c.dt (NaN never passes), and the reference's fully
 * masked rows exactly (O = 0, LSE = -inf, dQ = 0); print one line under
 * `label`, and on a failure the first mismatching elements. Whether all
 * passed. Gradients that miss are judged again against the reference given
 * the tested O and LSE, with their measured sensitivity to that rounding
 * added to the tolerance (docs/testing.md); the reference's O and LSE are
 * then the tested ones. */
bool tl_call_compare(TlCall *c, unsigned what, const char *label);
/* tl_call_compare, failing the test when it does not pass. */
void tl_call_check(TlCall *c, unsigned what, const char *label);
void tl_call_free(TlCall *c);
/* Print the first `max` elements of x that differ from ref by more than
 * tol times ref's root mean square (NaN against a number, unequal
 * infinities), with their coordinates; returns how many differ. */
int64_t tl_mismatches(const char *what, const RtArray *x, const RtArray *ref, double tol, int max);

/* The kernel template `name` as the library embeds it (aborts the test
 * when there is none), and `text` with the one occurrence of `from`
 * replaced by `to`, into *out (aborts when `from` is missing or repeated):
 * for tests that mutate a kernel (testlib_mutate.c). */
const char *tl_embedded(const char *name);
void tl_replace_once(Buf *out, const char *text, const char *from, const char *to);

/* Run a Check suite with the default settings; the process exit status. */
int tl_run_suite(Suite *s);

/* A suite as data: each entry a test run `loops` times (_i = 0 ..
 * loops-1; 0: left out, for tests a build or machine cannot run), or, with
 * test NULL and tcase set, the start of a test case whose per-test timeout
 * is `loops` seconds (0: Check's default), with a checked fixture run
 * around each test; an all-zero entry ends the table. The tests before any
 * header form a test case named after the suite with timeout `timeout`. */
typedef struct TlTest {
  const TTest *test;           /* START_TEST's name, or NULL */
  int loops;                   /* loop count, or a header's timeout */
  const char *tcase;           /* a header's test case name */
  SFun setup, teardown;        /* a header's checked fixture (NULL: none) */
} TlTest;
/* Build suite `name` from `tests` and run it (fork mode as CK_FORK says);
 * the process exit status. */
int tl_main(const char *name, int timeout, const TlTest *tests);
/* Run the suite's tests in this process (CK_FORK=no, unless the
 * environment sets CK_FORK), so that the modules the emulator builds for one
 * test serve the next (a test no longer starts from a fresh process, and a
 * crash ends the suite). */
void tl_one_process(void);
/* The entries, and the whole call with its table:
 *   return TL_MAIN("nonfinite", 300, TL_LOOP(kept_inputs, 6), TL_TEST(masked));  */
#define TL_TEST(t) {(t), 1, NULL, NULL, NULL}
#define TL_LOOP(t, n) {(t), (n), NULL, NULL, NULL}
#define TL_CASE(name, secs) {NULL, (secs), (name), NULL, NULL}
#define TL_FIXTURE(name, secs, setup, teardown) {NULL, (secs), (name), (setup), (teardown)}
#define TL_MAIN(name, timeout, ...) tl_main((name), (timeout), (const TlTest[]){__VA_ARGS__, {0}})

/* Run a forward (or backward) whose tensors are in host memory on the CUDA
 * backend: every tensor is mirrored on the device, the outputs are copied
 * back into the host tensors (testlib_cuda.c, on flex_mirror.h). A failure
 * is also printed to stderr as "tl_cuda_call: forward failed: why". */
flex_status tl_cuda_call(flex_kernel *k, const flex_args *host, bool backward);
/* tests/cuda/mockcuda.c compiled with the host C compiler ($CC, else cc)
 * into a temporary libcuda.so.1 (removed at exit), once per process: its
 * path (for $FLEXC_LIBCUDA), or NULL (said why on stderr). */
const char *tl_mock_driver(void);
/* A forward (or backward) of host tensors on a->backend: tl_cuda_call for
 * FLEX_BACKEND_CUDA, flex_forward (flex_backward) otherwise. */
flex_status tl_call(flex_kernel *k, const flex_args *a, bool backward);
/* For a suite's --cuda mode, before the suite runs: 0 when device 0 can be
 * used, else 77 (no CUDA device: skipped) or 1 (device 0 fails) after
 * printing why; the caller returns a nonzero result as it is. Sets
 * CK_FORK=no: the CUDA driver cannot be used in a child forked after the
 * parent initialised it, so the cases run in this one process (a failed
 * assertion still ends only its own case). */
int tl_cuda_setup(void);
/* A suite's --cuda mode: -1 when no argument is "--cuda" (the suite runs
 * as it does without it), else tl_cuda_setup's result: 0, run the suite's
 * CUDA table; 77 or 1, return it as it is:
 *   int rc = tl_cuda_mode(argc, argv);
 *   if (rc >= 0) return rc ? rc : TL_MAIN("cuda_x", 0, ...);  */
int tl_cuda_mode(int argc, char **argv);

#endif
