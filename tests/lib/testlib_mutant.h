/* testlib_mutant.h: kernels with one template edit, built and launched on
 * the emulator, which must catch the edit (check_emu_broken,
 * check_emu_sm90_broken; testlib_mutate.c). */
#ifndef FLEXC_TESTLIB_MUTANT_H
#define FLEXC_TESTLIB_MUTANT_H

#include "codegen/codegen.h"
#include "emu/emu_host.h"
#include "testlib.h"

/* How a mutation must show up. */
typedef enum TlDetect {
  TL_PASS,   /* a control: no error and a result within tolerance, plain and race-checked */
  TL_RACE,   /* the race-checking build fails the launch with a shared memory race */
  TL_BOUNDS, /* the launch fails its global bounds check */
  TL_WRONG,  /* the result is outside the tolerance (or the launch fails) */
  TL_FAILS,  /* the launch fails (a deadlock, a broken rule) */
} TlDetect;

/* The generated source `gen` with the embedded template `file` edited
 * (the one occurrence of `from` replaced by `to`) and spliced in before
 * the line `at` (the #include of it, or of a header that includes it), so
 * that the template's include guard hides the original; `gen` itself when
 * file is NULL. Freed with base_free. */
char *tl_mutant_source(const char *gen, const char *at, const char *file, const char *from,
                       const char *to);
/* The emulator module of `src`, race-checking when race; a build failure
 * fails the test, naming `what`. */
EmuModule *tl_mutant_build(const char *src, bool race, const char *what);
/* Launch entry `name` of m with `params` and geometry g; every global
 * access must fall in r[0..nr). The emulator's message into msg
 * (EMU_ERR_LEN bytes, "" on success). */
flex_status tl_mutant_launch(EmuModule *m, const char *name, const void *params, CgLaunch g,
                             const EmuRange *r, int nr, char *msg);
/* One run of a mutation case: build (race-checked when race) and launch
 * it on fresh inputs; the launch status, its message into msg and the
 * result's relative error against the reference into *err (infinity when
 * the launch failed). */
typedef flex_status (*TlMutantRun)(const void *ctx, bool race, char *msg, double *err);
/* Run the case as `detect` demands and fail the test when a control fails
 * or a mutation goes undetected (error tolerance tol). */
void tl_mutant_expect(const char *what, TlDetect detect, double tol, TlMutantRun run, const void *ctx);

#endif
