/* testlib.h: helpers shared by the Check suites. */
#ifndef FLEXC_TESTLIB_H
#define FLEXC_TESTLIB_H

#include <stddef.h>
#include <stdint.h>

#include <check.h>

#include "base/base.h"

/* Path of a file in the source tree ("tests/cases/x.score" -> absolute). */
const char *tl_src_path(const char *rel);
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

/* Run a Check suite with the default settings; the process exit status. */
int tl_run_suite(Suite *s);

#endif
