/* testlib.c: helpers shared by the Check suites. */
#include "testlib.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* The source tree: $FLEXC_SRC_DIR when set, else the one compiled in; an
 * empty one (FLEXC_PORTABLE builds) is the working directory, and `rel` is
 * returned as it is, so a bundle's programs read its own samples/ and name
 * them by the same relative path on every machine (the path is part of the
 * generated source, hence of the kernel cache's key). */
const char *tl_src_path(const char *rel) {
  static char buf[8][4096];
  static int k;
  const char *dir = getenv("FLEXC_SRC_DIR");
  if (!dir) dir = FLEXC_SRC_DIR;
  if (!*dir) return rel;
  char *p = buf[k++ % 8];
  snprintf(p, sizeof buf[0], "%s/%s", dir, rel);
  return p;
}

flex_kernel *tl_load(const char *path, const char *name, const char *src) {
  flex_kernel *k = NULL;
  flex_status st = path ? flex_kernel_load(&k, tl_src_path(path), NULL)
                        : flex_kernel_from_source(&k, name, src, strlen(src), NULL);
  ck_assert_msg(st == FLEX_OK, "%s: %s", path ? path : name, flex_last_error());
  return k;
}

const char *tl_flexc(void) {
  const char *p = getenv("FLEXC_BIN");
  return p ? p : "flexc";
}

int tl_run(const char *cmd, Buf *out) {
  Buf full = {0};
  buf_printf(&full, "%s 2>&1", cmd);
  FILE *f = popen(full.data, "r");
  buf_free(&full);
  if (!f) return -1;
  char tmp[4096];
  size_t n;
  while ((n = fread(tmp, 1, sizeof tmp, f)) > 0) buf_put(out, tmp, n);
  if (!out->data) buf_put(out, "", 0);
  int st = pclose(f);
  if (WIFEXITED(st)) return WEXITSTATUS(st);
  if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
  return -1;
}

uint64_t tl_seed(void) {
  static uint64_t seed;
  static int done;
  if (!done) {
    const char *s = getenv("FLEXC_SEED");
    seed = s ? strtoull(s, NULL, 0) : ((uint64_t)time(NULL) * 2654435761u) ^ (uint64_t)getpid();
    fprintf(stderr, "seed: FLEXC_SEED=%llu\n", (unsigned long long)seed);
    done = 1;
  }
  return seed;
}

uint64_t tl_rand(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double tl_uniform(uint64_t *s) { return (double)(tl_rand(s) >> 11) * (1.0 / 9007199254740992.0); }

double tl_normal(uint64_t *s) {
  double u = tl_uniform(s), v = tl_uniform(s);
  if (u < 1e-300) u = 1e-300;
  return sqrt(-2.0 * log(u)) * cos(2.0 * 3.14159265358979323846 * v);
}

int tl_run_suite(Suite *s) {
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

void tl_one_process(void) { setenv("CK_FORK", "no", 0); }

int tl_main(const char *name, int timeout, const TlTest *tests) {
  Suite *s = suite_create(name);
  TCase *tc = NULL;
  for (const TlTest *t = tests; t->test || t->tcase; t++) {
    if (!t->test || !tc) {
      tc = tcase_create(t->test ? name : t->tcase);
      int secs = t->test ? timeout : t->loops;
      if (secs > 0) tcase_set_timeout(tc, secs);
      if (t->setup || t->teardown) tcase_add_checked_fixture(tc, t->setup, t->teardown);
      suite_add_tcase(s, tc);
      if (!t->test) continue;
    }
    if (t->loops > 0) tcase_add_loop_test(tc, t->test, 0, t->loops);
  }
  return tl_run_suite(s);
}
