/* bench_frontend: time the front half of the compiler on every sample.
 *
 *   bench_frontend [DIR] [RUNS]     (defaults: samples, 200)
 *
 * For each .score file in DIR: parse + check + pick the kernel + lower + fold +
 * cse + dce, in a fresh arena each run; prints the best of RUNS in
 * microseconds, split into front end (parse + check) and IR (lower + passes).
 * The target is well under 1 ms per sample.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ir/ir.h"

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* One timed compilation; false if the sample has errors. */
static bool compile_once(const Source *src, double *fe_us, double *ir_us) {
  Arena a = {0};
  Diags d;
  memset(&d, 0, sizeof d);
  d.src = src;
  double t0 = now_us();
  Program *p = fe_parse(&a, src, &d);
  bool ok = !d.errors && !fe_check(&a, p, &d) && !ir_check_values(&a, p, &d);
  double t1 = now_us();
  Decl *k = ok ? fe_pick_kernel(&a, p, NULL, &d) : NULL;
  IrModule *m = k ? ir_lower(&a, p, k) : NULL;
  if (m) ir_compile(m, false, NULL);
  double t2 = now_us();
  *fe_us = t1 - t0;
  *ir_us = t2 - t1;
  if (!m && d.text.data) fputs(d.text.data, stderr);
  diag_free(&d);
  arena_free(&a);
  return m != NULL;
}

static int by_name(const void *x, const void *y) {
  return strcmp(*(char *const *)x, *(char *const *)y);
}

/* The .score files of `dir`, sorted; *n set. */
static char **list_samples(const char *dir, int *n) {
  DIR *dp = opendir(dir);
  if (!dp) return NULL;
  char **names = NULL;
  int cap = 0;
  *n = 0;
  for (struct dirent *e; (e = readdir(dp));) {
    size_t len = strlen(e->d_name);
    if (len < 7 || strcmp(e->d_name + len - 6, ".score")) continue;
    if (*n == cap) {
      cap = cap ? cap * 2 : 16;
      names = base_realloc(names, sizeof(char *) * (size_t)cap);
    }
    Buf path = {0};
    buf_printf(&path, "%s/%s", dir, e->d_name);
    names[(*n)++] = path.data;
  }
  closedir(dp);
  qsort(names, (size_t)*n, sizeof(char *), by_name);
  return names;
}

int main(int argc, char **argv) {
  const char *dir = argc > 1 ? argv[1] : "samples";
  int runs = argc > 2 ? atoi(argv[2]) : 200;
  if (runs < 1) runs = 1;
  int n;
  char **files = list_samples(dir, &n);
  if (!files || n == 0) {
    fprintf(stderr, "bench_frontend: no .score files in '%s'\n", dir);
    return 1;
  }
  printf("%-36s %10s %10s %10s\n", "sample (best of runs, us)", "parse+chk", "lower+opt", "total");
  int failed = 0;
  for (int i = 0; i < n; i++) {
    char *text;
    size_t len;
    if (base_read_file(files[i], &text, &len)) {
      fprintf(stderr, "bench_frontend: cannot read %s\n", files[i]);
      failed = 1;
      continue;
    }
    Source src = {files[i], text, len};
    double best_fe = 1e30, best_ir = 1e30, best = 1e30;
    for (int r = 0; r < runs; r++) {
      double fe, ir;
      if (!compile_once(&src, &fe, &ir)) {
        failed = 1;
        break;
      }
      if (fe + ir < best) best = fe + ir;
      if (fe < best_fe) best_fe = fe;
      if (ir < best_ir) best_ir = ir;
    }
    const char *base = strrchr(files[i], '/');
    printf("%-36s %10.1f %10.1f %10.1f\n", base ? base + 1 : files[i], best_fe, best_ir, best);
    base_free(text);
    base_free(files[i]);
  }
  base_free(files);
  return failed;
}
