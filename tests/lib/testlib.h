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

/* The kernel template `name` as the library embeds it (aborts the test
 * when there is none), and `text` with the one occurrence of `from`
 * replaced by `to`, into *out (aborts when `from` is missing or repeated):
 * for tests that mutate a kernel (testlib_mutate.c). */
const char *tl_embedded(const char *name);
void tl_replace_once(Buf *out, const char *text, const char *from, const char *to);

/* Run a Check suite with the default settings; the process exit status. */
int tl_run_suite(Suite *s);

/* Run a forward (or backward) whose tensors are in host memory on the CUDA
 * backend: every tensor is mirrored on the device, the outputs are copied
 * back into the host tensors (testlib_cuda.c, on flex_mirror.h). A failure
 * is also printed to stderr as "tl_cuda_call: forward failed: why". */
flex_status tl_cuda_call(flex_kernel *k, const flex_args *host, bool backward);
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

#endif
